//! [`ConstraintCompiler`]: a model's vocabulary as llguidance's token trie, grammars compiled
//! against it (cached by their text), and [`ConstraintState`], one request's position in its
//! grammar, which gives each sampled row's allowed-token mask.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use super::tools::{self, ToolFormat};
use super::{Constraint, Grammar, gbnf};
use crate::error::{Result, WeftError};
use crate::tokenizer::Tokenizer;

/// Longest grammar, schema or regex text a request may ask to compile. llguidance's own limits
/// (lexer states, grammar symbols, work per mask) bound the rest.
pub const MAX_CONSTRAINT_BYTES: usize = 256 * 1024;

/// Compiled grammars kept, least recently used dropped first.
const CACHE_ENTRIES: usize = 128;

/// Words of an allowed-token bitmask over `vocab_size` tokens: bit `t % 32` of word `t / 32`
/// is token `t`, 1 = allowed.
pub fn mask_words(vocab_size: usize) -> usize {
    vocab_size.div_ceil(32)
}

/// JSON output the way Python's `json.dumps` writes it (", " and ": ", no other whitespace):
/// what models saw most in training, and a bounded length (free whitespace would let a weak
/// model pad forever).
fn json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with weft's JSON formatting options, unless the schema sets its own.
pub(crate) fn with_json_options(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(json_options);
    }
    schema
}

/// The vocabulary as llguidance sees it: the trie of token bytes, and weft's tokenizer for the
/// canonical tokenization of text the grammar forces.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<dyn Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Bytes that are not UTF-8 (half a character) go through the trie, greedily.
        self.trie.tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode(text, false).unwrap_or_default())
    }
}

/// A compiled grammar: its parser at the start, and the mask of the first token.
struct Compiled {
    matcher: Matcher,
    first_mask: Arc<Vec<u32>>,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<String, (u64, Arc<Compiled>)>,
    tick: u64,
}

impl Cache {
    fn get(&mut self, key: &str) -> Option<Arc<Compiled>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(used, c)| {
            *used = tick;
            c.clone()
        })
    }

    fn insert(&mut self, key: String, compiled: Arc<Compiled>) {
        if self.entries.len() >= CACHE_ENTRIES
            && let Some(oldest) = self.entries.iter().min_by_key(|(_, (used, _))| *used).map(|(k, _)| k.clone())
        {
            self.entries.remove(&oldest);
        }
        self.tick += 1;
        self.entries.insert(key, (self.tick, compiled));
    }
}

/// Compiles constraints against one model's vocabulary. Built once per engine (building the
/// token trie walks the whole vocabulary), shared by every request.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    tool_format: ToolFormat,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab_size", &self.vocab_size)
            .field("tool_format", &self.tool_format)
            .finish_non_exhaustive()
    }
}

impl ConstraintCompiler {
    /// A compiler for `tokenizer`'s vocabulary, with masks `vocab_size` wide (the model's logit
    /// rows; ids past the tokenizer's are never allowed).
    pub fn new(tokenizer: Arc<dyn Tokenizer>, vocab_size: usize) -> Result<Self> {
        let eos: Vec<u32> = tokenizer.eos_token_ids().iter().copied().filter(|&t| (t as usize) < vocab_size).collect();
        let Some(&first_eos) = eos.first() else {
            return Err(WeftError::Unsupported(
                "structured output needs an end-of-sequence token, and this vocabulary has none".into(),
            ));
        };
        let mut words: Vec<Vec<u8>> = tokenizer
            .token_bytes()
            .into_iter()
            .map(|t| {
                let mut bytes = t.bytes;
                if t.special {
                    // llguidance's marker: a control token never matches its spelling in text.
                    bytes.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
                }
                bytes
            })
            .collect();
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let tool_format = ToolFormat::detect(tokenizer.chat_template().map(|t| t.source()));
        let env: TokEnv = Arc::new(VocabEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| WeftError::Unsupported(format!("structured output cannot use this vocabulary: {e}")))?;
        factory.quiet();
        // Errors name the problem, not the whole grammar and parser state.
        factory.limits_mut().verbose_errors = false;
        Ok(ConstraintCompiler { factory, vocab_size, tool_format, cache: Mutex::new(Cache::default()) })
    }

    /// The model's tool-call format, recognised from its chat template.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// Compiled grammars in the cache.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).entries.len()
    }

    /// A fresh state for `constraint`, compiled now or taken from the cache. A grammar that
    /// does not compile, is too big, or cannot produce anything is refused, naming the field.
    pub fn compile(&self, constraint: &Constraint) -> Result<ConstraintState> {
        let field = constraint.field.as_str();
        let size = constraint.grammar.text_len();
        if size > MAX_CONSTRAINT_BYTES {
            return Err(WeftError::invalid(
                field,
                format!("the constraint is {size} bytes; at most {MAX_CONSTRAINT_BYTES} are compiled"),
            ));
        }
        let key = constraint.grammar.cache_key();
        let hit = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key);
        let compiled = match hit {
            Some(c) => c,
            None => {
                let compiled = Arc::new(self.build(&constraint.grammar).map_err(|e| WeftError::invalid(field, e))?);
                self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(key, compiled.clone());
                compiled
            }
        };
        Ok(ConstraintState {
            matcher: compiled.matcher.clone(),
            first_mask: compiled.first_mask.clone(),
            num_consumed: 0,
            vocab_size: self.vocab_size,
        })
    }

    fn build(&self, grammar: &Grammar) -> std::result::Result<Compiled, String> {
        let top = self.top_level(grammar)?;
        let parser = self.factory.create_parser(top).map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        let first = matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        if first.is_zero() {
            return Err("no token can start the output".into());
        }
        Ok(Compiled { first_mask: Arc::new(words_of(&first, self.vocab_size)), matcher })
    }

    fn top_level(&self, grammar: &Grammar) -> std::result::Result<TopLevelGrammar, String> {
        Ok(match grammar {
            Grammar::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(format!("a JSON schema is an object (or true/false), got {schema}"));
                }
                TopLevelGrammar::from_json_schema(with_json_options(schema.clone()))
            }
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"}))),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
            Grammar::Choice(choices) => {
                if choices.is_empty() {
                    return Err("the list of choices is empty".into());
                }
                let literals: Vec<String> =
                    choices.iter().map(|c| serde_json::to_string(c).unwrap_or_default()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", literals.join(" | ")))
            }
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Gbnf(g) => TopLevelGrammar::from_lark(gbnf::to_lark(g)?),
            Grammar::ToolCalls { tools, name, parallel } => {
                let trie = self.factory.tok_env().tok_trie();
                let special = |text: &str| trie.get_special_token(text);
                TopLevelGrammar::from_lark(tools::grammar(
                    self.tool_format,
                    tools,
                    name.as_deref(),
                    *parallel,
                    &special,
                )?)
            }
        })
    }
}

/// A mask's words, `vocab_size` bits.
fn words_of(mask: &SimpleVob, vocab_size: usize) -> Vec<u32> {
    let mut words = mask.as_slice().to_vec();
    words.resize(mask_words(vocab_size), 0);
    words
}

/// Whether a mask allows `token`.
fn allows(words: &[u32], token: u32) -> bool {
    words.get(token as usize / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

/// What a kept token did to a constrained request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advance {
    /// More may follow.
    Continue,
    /// The output is complete: the grammar allows nothing but its end here.
    Done,
}

/// One request's position in its grammar.
pub struct ConstraintState {
    matcher: Matcher,
    first_mask: Arc<Vec<u32>>,
    num_consumed: usize,
    vocab_size: usize,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState").field("num_consumed", &self.num_consumed).finish_non_exhaustive()
    }
}

impl ConstraintState {
    fn error(&self, what: &str, e: impl std::fmt::Display) -> WeftError {
        WeftError::Unsupported(format!("structured output failed {what}: {e}"))
    }

    /// The mask of the next token.
    fn mask(&mut self) -> Result<Vec<u32>> {
        if self.num_consumed == 0 {
            return Ok(self.first_mask.as_ref().clone());
        }
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| self.error("computing a token mask", e))?;
        Ok(words_of(&mask, self.vocab_size))
    }

    /// One mask per sampled row: the next token's, then, for each drafted token the step
    /// verifies, the mask after it (computed on a copy, so this state does not move). A draft
    /// the grammar refuses can never be accepted (the row before it cannot sample it), so the
    /// rows after it, which will be thrown away, repeat the last mask.
    pub fn masks(&mut self, drafted: &[u32]) -> Result<Vec<Vec<u32>>> {
        let mut out = vec![self.mask()?];
        if drafted.is_empty() {
            return Ok(out);
        }
        let mut ahead = self.matcher.clone();
        let mut refused = false;
        for &token in drafted {
            let last = out.last().cloned().unwrap_or_default();
            refused = refused || !allows(&last, token) || ahead.consume_token(token).is_err();
            let next = if refused {
                last
            } else {
                ahead.compute_mask_or_eos().map(|m| words_of(&m, self.vocab_size)).unwrap_or(last)
            };
            out.push(next);
        }
        Ok(out)
    }

    /// Take one kept token (never an end-of-sequence token: those end the request anyway).
    /// A token the grammar refuses is an error: the sampler was given the mask, so it means the
    /// mask was not applied.
    pub fn advance(&mut self, token: u32) -> Result<Advance> {
        self.matcher.consume_token(token).map_err(|e| self.error(&format!("at token {token}"), e))?;
        self.num_consumed += 1;
        Ok(if self.matcher.is_stopped() { Advance::Done } else { Advance::Continue })
    }
}
