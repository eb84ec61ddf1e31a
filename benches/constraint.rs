//! `cargo bench --bench constraint [-- MODEL.gguf]`: what structured output costs on the host,
//! on a real vocabulary (the default model's 49,152 tokens unless a GGUF file is given). A
//! benchmark, not a test: it prints a table.
//!
//! - building the compiler (the token trie of the whole vocabulary), once per engine;
//! - compiling each constraint (and its first mask), once per distinct constraint text;
//! - computing a mask, and taking a token, per generated token: a walk of `STEPS` tokens, each
//!   drawn at random among the allowed ones (median and 90th percentile of the mask times,
//!   median of the advance times, over the walk).

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use weft::constraint::{Advance, Constraint, ConstraintCompiler, Grammar};
use weft::model::load::ModelFiles;
use weft::sampling::SamplerRng;
use weft::tokenizer::Tokenizer;

const STEPS: usize = 200;

fn cases() -> Vec<(&'static str, Grammar)> {
    let person = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}, "maxItems": 3},
        },
        "required": ["name", "age", "email", "tags"],
        "additionalProperties": false,
    });
    let records = json!({"type": "array", "minItems": 1000, "items": person});
    let nested = json!({
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                            "required": ["x", "y"], "additionalProperties": false}},
        "type": "object",
        "properties": {
            "shapes": {"type": "array", "maxItems": 50, "items": {"anyOf": [
                {"type": "object", "properties": {"kind": {"const": "circle"}, "center": {"$ref": "#/$defs/point"},
                 "r": {"type": "number", "minimum": 0}}, "required": ["kind", "center", "r"], "additionalProperties": false},
                {"type": "object", "properties": {"kind": {"const": "poly"}, "points": {"type": "array",
                 "items": {"$ref": "#/$defs/point"}, "minItems": 3}}, "required": ["kind", "points"], "additionalProperties": false},
            ]}},
            "note": {"type": "string", "pattern": "^[A-Za-z ]{0,80}$"},
        },
        "required": ["shapes"],
        "additionalProperties": false,
    });
    let gbnf = "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") factor)*\n\
                factor ::= [0-9]+ | \"(\" expr \")\"";
    vec![
        ("json_object", Grammar::JsonObject),
        ("schema: person", Grammar::JsonSchema(person)),
        ("schema: 1000 records", Grammar::JsonSchema(records)),
        ("schema: nested anyOf/$ref", Grammar::JsonSchema(nested)),
        ("regex: dates", Grammar::Regex("(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])( .*)?".into())),
        ("choice: 100 words", Grammar::Choice((0..100).map(|i| format!("option number {i}")).collect())),
        ("gbnf: arithmetic", Grammar::Gbnf(gbnf.into())),
    ]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn main() -> weft::Result<()> {
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let files = ModelFiles::open(std::path::Path::new(&path))?;
    let tokenizer: Arc<dyn Tokenizer> = files.tokenizer.clone();
    let vocab = files.config.vocab_size;
    let started = Instant::now();
    let compiler = ConstraintCompiler::new(tokenizer, vocab)?;
    println!("{path}: vocabulary of {vocab} tokens; compiler (token trie) built in {:.1} ms\n", ms(started));
    println!(
        "{:<28} {:>11} {:>11} {:>12} {:>12} {:>11} {:>7}",
        "constraint", "compile ms", "cached ms", "mask p50 us", "mask p90 us", "advance us", "tokens"
    );
    for (name, grammar) in cases() {
        let c = Constraint::new("bench", grammar);
        let t = Instant::now();
        let mut state = compiler.compile(&c)?;
        let compile = ms(t);
        let t = Instant::now();
        let _again = compiler.compile(&c)?;
        let cached = ms(t);
        let mut rng = SamplerRng::new(1);
        let eos = files.tokenizer.eos_token_ids();
        let (mut masks, mut advances) = (Vec::with_capacity(STEPS), Vec::with_capacity(STEPS));
        for _ in 0..STEPS {
            let t = Instant::now();
            let mask = state.masks(&[])?.remove(0);
            masks.push(t.elapsed().as_secs_f64() * 1e6);
            // A random allowed token; end-of-sequence only when nothing else is allowed.
            let allowed: Vec<u32> = (0..vocab as u32)
                .filter(|&tok| mask[tok as usize / 32] >> (tok % 32) & 1 == 1 && !eos.contains(&tok))
                .collect();
            let Some(&token) = allowed.get(rng.below(allowed.len())) else { break };
            let t = Instant::now();
            let done = state.advance(token)?;
            advances.push(t.elapsed().as_secs_f64() * 1e6);
            if done == Advance::Done {
                break;
            }
        }
        masks.sort_by(f64::total_cmp);
        advances.sort_by(f64::total_cmp);
        println!(
            "{name:<28} {compile:>11.1} {cached:>11.3} {:>12.0} {:>12.0} {:>11.0} {:>7}",
            percentile(&masks, 0.5),
            percentile(&masks, 0.9),
            percentile(&advances, 0.5),
            advances.len()
        );
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
