//! `cargo xtask bench`: the performance issue's benchmark, end to end. It builds `weft` in
//! release, runs `weft bench --json` over a set of (concurrency, prompt length) runs, saves the
//! JSON with where and when it was measured under bench/results/, and regenerates the tables in
//! bench/README.md from every file there (between markers; the hand-written text around them
//! stays). `--peer` also runs llama.cpp on the same GGUF and workload (`peer.rs`) and prints the
//! weft/llama.cpp ratios; `cargo xtask make-model` writes random-weight GGUFs of real shapes. The
//! packed check for a machine with a GPU is `cargo xtask device-check` (`device_check.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::peer::{self, PeerKind};
use crate::{MODEL_FILE, Result, cargo, ensure_gpu_driver, fetch_model, root, run, target_dir, with_gpu_env};

/// A named set of runs: every concurrency level at every prompt length.
#[derive(Clone, Debug, PartialEq)]
pub struct Set {
    pub name: String,
    pub concurrency: Vec<usize>,
    pub prompt_len: Vec<usize>,
    pub gen_len: usize,
    pub repeats: usize,
}

impl Set {
    /// The standard set: concurrency 1, 4, 16, 64; prompts of 128 and 512; 128 generated.
    pub fn standard() -> Set {
        Set {
            name: "standard".into(),
            concurrency: vec![1, 4, 16, 64],
            prompt_len: vec![128, 512],
            gen_len: 128,
            repeats: 3,
        }
    }

    /// A smoke check: minutes on a CPU driver.
    pub fn quick() -> Set {
        Set { name: "quick".into(), concurrency: vec![1, 4], prompt_len: vec![32], gen_len: 16, repeats: 1 }
    }

    /// One line saying what runs: "standard: concurrency 1,4 × prompts 128 → 128 generated, median of 3".
    pub fn describe(&self) -> String {
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        format!(
            "{}: concurrency {} × prompts of {} tokens, {} generated per sequence, median of {} repeat{}",
            self.name,
            list(&self.concurrency),
            list(&self.prompt_len),
            self.gen_len,
            self.repeats,
            if self.repeats == 1 { "" } else { "s" }
        )
    }
}

/// What `cargo xtask bench` was asked to do.
#[derive(Debug, PartialEq)]
pub struct Options {
    pub set: Set,
    pub model: Option<PathBuf>,
    /// `--kv-memory` and `--kv-cache-dtype`, passed on to `weft bench`.
    pub kv_args: Vec<String>,
    pub peer: bool,
    /// Where the results JSON goes (bench/results unless --out).
    pub out: Option<PathBuf>,
    /// Leave bench/results and bench/README.md alone (the quick set's default).
    pub no_save: bool,
}

const USAGE: &str = "cargo xtask bench [--quick] [--model FILE.gguf] [--concurrency 1,4,16,64] [--prompt-len 128,512] \
[--gen-len 128] [--repeats 3] [--kv-memory 1GiB] [--kv-cache-dtype f32|f16] [--peer] [--out DIR] [--no-save] \
| --table";

/// Parses the flags of `cargo xtask bench` (not --table, handled before).
pub fn parse(args: &[String]) -> Result<Options> {
    let (mut concurrency, mut prompt_len, mut gen_len, mut repeats) = (None, None, None, None);
    let mut quick = false;
    let mut opts =
        Options { set: Set::standard(), model: None, kv_args: Vec::new(), peer: false, out: None, no_save: false };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value\nusage: {USAGE}"));
        match flag.as_str() {
            "--quick" => quick = true,
            "--peer" => opts.peer = true,
            "--no-save" => opts.no_save = true,
            "--model" => opts.model = Some(PathBuf::from(value()?)),
            "--out" => opts.out = Some(PathBuf::from(value()?)),
            "--kv-memory" | "--kv-cache-dtype" => {
                let value = value()?.clone();
                opts.kv_args.extend([flag.clone(), value]);
            }
            "--concurrency" => concurrency = Some(positive_list(flag, value()?)?),
            "--prompt-len" => prompt_len = Some(positive_list(flag, value()?)?),
            "--gen-len" => gen_len = Some(positive(flag, value()?)?),
            "--repeats" => repeats = Some(positive(flag, value()?)?),
            other => return Err(format!("unknown argument {other:?}\nusage: {USAGE}")),
        }
    }
    let base = if quick { Set::quick() } else { Set::standard() };
    let set = Set {
        name: base.name.clone(),
        concurrency: concurrency.unwrap_or_else(|| base.concurrency.clone()),
        prompt_len: prompt_len.unwrap_or_else(|| base.prompt_len.clone()),
        gen_len: gen_len.unwrap_or(base.gen_len),
        repeats: repeats.unwrap_or(base.repeats),
    };
    // A changed set is no longer the one its name promises.
    let name = if set == base { base.name } else { format!("{} (changed)", base.name) };
    opts.set = Set { name, ..set };
    // A smoke check does not replace saved results unless told where to write.
    opts.no_save |= quick && opts.out.is_none();
    if opts.peer && !(opts.set.concurrency.contains(&1) && opts.set.concurrency.contains(&16)) {
        return Err("--peer compares decode at batch 1 and 16 sequences: the set needs concurrency 1 and 16".into());
    }
    Ok(opts)
}

fn positive(flag: &str, value: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} takes a positive whole number, not {value:?}")),
    }
}

fn positive_list(flag: &str, value: &str) -> Result<Vec<usize>> {
    value.split(',').map(|v| positive(flag, v)).collect()
}

/// `cargo xtask bench ...`
pub fn bench(args: &[String]) -> Result {
    if args.first().is_some_and(|a| a == "--table") {
        return write_readme(&results_dir());
    }
    let opts = parse(args)?;
    ensure_gpu_driver()?;
    let model = match &opts.model {
        Some(m) => m.canonicalize().map_err(|e| format!("--model {}: {e}", m.display()))?,
        None => {
            fetch_model()?;
            root().join(MODEL_FILE)
        }
    };
    let weft = build_weft()?;
    // The peers are built (once, for long) before anything is measured, so that weft and
    // llama.cpp run one right after the other, on the same machine state.
    let pythons = if opts.peer {
        vec![(PeerKind::Vulkan, peer::ensure(PeerKind::Vulkan)?), (PeerKind::Cpu, peer::ensure(PeerKind::Cpu)?)]
    } else {
        Vec::new()
    };
    eprintln!("xtask: weft bench, {}", opts.set.describe());
    let mut doc = run_weft(&weft, &model, &opts.set, &opts.kv_args, &[], None)?;
    if opts.peer {
        doc["peers"] = Value::Array(run_peers(&pythons, &model, &opts.set)?);
    }
    println!("{}", markdown_for(&doc));
    if opts.peer {
        for line in ratio_lines(&doc) {
            println!("{line}");
        }
    }
    if opts.no_save {
        eprintln!("xtask: not saved (--quick or --no-save); the full set saves to bench/results/");
        return Ok(());
    }
    let dir = opts.out.clone().unwrap_or_else(results_dir);
    let adapter = doc["adapter"]["name"].as_str().unwrap_or("");
    let name = results_name(adapter, opts.model.is_some().then_some(model.as_path()), &opts.set, &opts.kv_args);
    let path = save(&doc, &dir, &name)?;
    eprintln!("xtask: wrote {}", path.display());
    if opts.out.is_none() {
        write_readme(&dir)?;
    }
    Ok(())
}

pub fn results_dir() -> PathBuf {
    root().join("bench").join("results")
}

/// `cargo build --release -p weft-native`; the binary's path.
pub fn build_weft() -> Result<PathBuf> {
    let mut build = cargo();
    build.args(["build", "--release", "-p", "weft-native"]);
    run(build)?;
    Ok(target_dir().join("release").join(if cfg!(windows) { "weft.exe" } else { "weft" }))
}

/// One `weft bench --json` over `set`, with `kv_args` (its KV cache flags) and `env` added and
/// ended after `timeout`; its JSON plus where and when it ran.
pub fn run_weft(
    weft: &Path,
    model: &Path,
    set: &Set,
    kv_args: &[String],
    env: &[(&str, &str)],
    timeout: Option<Duration>,
) -> Result<Value> {
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(weft);
    cmd.arg("bench").arg("--json").arg("--model").arg(model);
    cmd.args(["--concurrency", &list(&set.concurrency), "--prompt-len", &list(&set.prompt_len)]);
    cmd.args(["--gen-len", &set.gen_len.to_string(), "--repeats", &set.repeats.to_string()]);
    cmd.args(kv_args);
    let mut cmd = with_gpu_env(cmd);
    cmd.envs(env.iter().copied());
    let load_before = load_average();
    let started = Instant::now();
    let stdout = peer::output_within(cmd, timeout)?;
    let mut doc: Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("weft bench --json printed something else ({e}):\n{stdout}"))?;
    doc["set"] = json!({
        "name": set.name, "concurrency": set.concurrency, "prompt_len": set.prompt_len,
        "gen_len": set.gen_len, "repeats": set.repeats,
    });
    doc["measured"] = json!({
        "date": utc_now(),
        "weft_commit": git_commit(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "duration_s": started.elapsed().as_secs_f64().round(),
        "kv_args": kv_args,
    });
    Ok(doc)
}

/// llama.cpp's Vulkan and CPU builds (the venvs' pythons, in that order) on the workload of the
/// set's 128-token (or first) prompt length.
pub fn run_peers(pythons: &[(PeerKind, PathBuf)], model: &Path, set: &Set) -> Result<Vec<Value>> {
    let prompt_len = peer_prompt_len(set);
    let mut peers = Vec::new();
    for (kind, python) in pythons {
        let load_before = load_average();
        let mut v = peer::measure(*kind, python, model, prompt_len, set.gen_len, 16, set.repeats, &[], None)?;
        v["measured"] =
            json!({"date": utc_now(), "load_average_before": load_before, "load_average_after": load_average()});
        peers.push(v);
    }
    Ok(peers)
}

/// The prompt length the peer comparison uses: 128 when the set has it.
pub fn peer_prompt_len(set: &Set) -> usize {
    if set.prompt_len.contains(&128) { 128 } else { set.prompt_len[0] }
}

/// The 1, 5 and 15 minute load averages (Linux); the benchmarks share the machine.
pub fn load_average() -> Value {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).filter_map(|x| x.parse::<f64>().ok()).collect::<Vec<_>>())
        .filter(|v| v.len() == 3)
        .map_or(Value::Null, |v| json!(v))
}

fn git_commit() -> Value {
    let out = Command::new("git").current_dir(root()).args(["describe", "--always", "--dirty"]).output();
    match out {
        Ok(o) if o.status.success() => json!(String::from_utf8_lossy(&o.stdout).trim()),
        _ => Value::Null,
    }
}

/// Now as "YYYY-MM-DD HH:MM UTC" (no date crate: days since 1970 to a civil date, Howard
/// Hinnant's algorithm).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    utc_date(secs)
}

fn utc_date(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rest / 3600, rest % 3600 / 60)
}

/// A file name from an adapter name: "llvmpipe (LLVM 15.0.6, 256 bits)" → "llvmpipe-llvm-15-0-6-256-bits".
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-').to_string();
    if out.is_empty() { "unknown-adapter".into() } else { out }
}

/// The results file of a run: `<adapter>.json` for the standard set on the default model, with
/// `.<model>` for another model, `.<set>` for another set (e.g. `c1-16.p128.g128.r1`) and
/// `.<kv flags>` for weft's KV cache flags (e.g. `kv-cache-dtype-f16`), so that no run
/// overwrites another kind of run.
pub fn results_name(adapter: &str, other_model: Option<&Path>, set: &Set, kv_args: &[String]) -> String {
    let mut name = slug(adapter);
    if let Some(stem) = other_model.and_then(|m| m.file_stem()) {
        name = format!("{name}.{}", slug(&stem.to_string_lossy()));
    }
    let standard = Set::standard();
    let same = set.concurrency == standard.concurrency
        && set.prompt_len == standard.prompt_len
        && set.gen_len == standard.gen_len
        && set.repeats == standard.repeats;
    if !same {
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join("-");
        name =
            format!("{name}.c{}.p{}.g{}.r{}", list(&set.concurrency), list(&set.prompt_len), set.gen_len, set.repeats);
    }
    if !kv_args.is_empty() {
        name = format!("{name}.{}", slug(&kv_args.join(" ")));
    }
    name + ".json"
}

/// Writes `doc` as `dir/name`.
pub fn save(doc: &Value, dir: &Path, name: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())? + "\n";
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

pub const BEGIN_MARKER: &str =
    "<!-- bench-results:begin (generated by `cargo xtask bench` from bench/results/*.json; do not edit) -->";
pub const END_MARKER: &str = "<!-- bench-results:end -->";

/// Regenerates the part of bench/README.md between the markers from every JSON file in `dir`.
pub fn write_readme(dir: &Path) -> Result {
    let readme = root().join("bench").join("README.md");
    let text = std::fs::read_to_string(&readme).map_err(|e| format!("reading {}: {e}", readme.display()))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        docs.push((f.file_name().unwrap_or_default().to_string_lossy().into_owned(), doc));
    }
    let generated = generated_section(&docs);
    let updated = replace_between_markers(&text, &generated).ok_or_else(|| {
        format!("{} lacks the markers {BEGIN_MARKER} and {END_MARKER} (in that order)", readme.display())
    })?;
    if updated != text {
        std::fs::write(&readme, updated).map_err(|e| format!("writing {}: {e}", readme.display()))?;
        eprintln!("xtask: updated the tables in {}", readme.display());
    }
    Ok(())
}

/// `text` with what lies between the markers replaced by `generated`; `None` without markers.
pub fn replace_between_markers(text: &str, generated: &str) -> Option<String> {
    let begin = text.find(BEGIN_MARKER)? + BEGIN_MARKER.len();
    let end = begin + text[begin..].find(END_MARKER)?;
    Some(format!("{}\n{}\n{}", &text[..begin], generated.trim_end(), &text[end..]))
}

/// One section per results file: where and how it was measured, the runs, the peers.
pub fn generated_section(docs: &[(String, Value)]) -> String {
    if docs.is_empty() {
        return "No results yet: run `cargo xtask bench`.\n".into();
    }
    docs.iter()
        .map(|(file, doc)| format!("### {}\n\n`bench/results/{file}`\n\n{}", title(doc), markdown_for(doc)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn title(doc: &Value) -> String {
    let a = &doc["adapter"];
    format!(
        "{} ({}, {} kernels), {}",
        a["name"].as_str().unwrap_or("unknown adapter"),
        a["backend"].as_str().unwrap_or("?"),
        a["kernels"].as_str().unwrap_or("?"),
        doc["model"].as_str().unwrap_or("?")
    )
}

/// Formats `v` with `digits` decimals, or "–" for null.
fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// The runs table (and the side-by-side table when the peers ran) of one results document.
pub fn markdown_for(doc: &Value) -> String {
    let mut out = String::new();
    let set = &doc["set"];
    let m = &doc["measured"];
    if let Some(name) = set["name"].as_str() {
        let list = |v: &Value| {
            v.as_array().map_or(String::new(), |a| a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
        };
        out.push_str(&format!(
            "Set **{name}**: concurrency {} × prompts of {} tokens, {} generated per sequence, medians of {} repeats. ",
            list(&set["concurrency"]),
            list(&set["prompt_len"]),
            set["gen_len"],
            set["repeats"]
        ));
    }
    if m.is_object() {
        let kv_args = m["kv_args"].as_array().map_or(String::new(), |a| {
            let args: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            if args.is_empty() { String::new() } else { format!(", weft run with `{}`", args.join(" ")) }
        });
        out.push_str(&format!(
            "Measured {} at weft {}{kv_args} on {} CPUs, load average {} before and {} after ({} s).\n\n",
            m["date"].as_str().unwrap_or("?"),
            m["weft_commit"].as_str().unwrap_or("?"),
            m["cpus"],
            loads(&m["load_average_before"]),
            loads(&m["load_average_after"]),
            m["duration_s"]
        ));
    } else if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str("| conc | prompt | gen | prefill tok/s | decode tok/s/seq | total tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | host ms/step | GPU ms/step | GPU MiB | RSS MiB |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in doc["runs"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["concurrency"],
            r["prompt_len"],
            r["gen_len"],
            num(&r["prefill_tok_s"], 1),
            num(&r["decode_tok_s_per_seq"], 2),
            num(&r["aggregate_tok_s"], 2),
            num(&r["ttft_ms_p50"], 0),
            num(&r["ttft_ms_p99"], 0),
            num(&r["itl_ms_p50"], 1),
            num(&r["itl_ms_p99"], 1),
            num(&r["host_ms_per_step_p50"], 2),
            num(&r["gpu_ms_per_step_p50"], 1),
            num(&r["gpu_mem_mib"], 0),
            num(&r["host_rss_mib"], 0),
        ));
    }
    if let Some(peers) = doc["peers"].as_array().filter(|p| !p.is_empty()) {
        out.push('\n');
        out.push_str(&side_by_side(doc, peers));
    }
    out
}

fn loads(v: &Value) -> String {
    v.as_array().map_or("?".into(), |a| a.iter().map(|x| num(x, 2)).collect::<Vec<_>>().join(" / "))
}

/// weft's figures on the peer's workload: prefill and decode of a lone prompt, aggregate at 16,
/// and the peak RSS by the end of the 16-sequence run.
pub fn weft_side(doc: &Value, prompt_len: u64) -> Option<[f64; 4]> {
    let runs = doc["runs"].as_array()?;
    let find = |c: u64| {
        runs.iter().find(|r| r["concurrency"].as_u64() == Some(c) && r["prompt_len"].as_u64() == Some(prompt_len))
    };
    let (one, sixteen) = (find(1)?, find(16)?);
    Some([
        one["prefill_tok_s"].as_f64()?,
        one["decode_tok_s_per_seq"].as_f64()?,
        sixteen["aggregate_tok_s"].as_f64()?,
        sixteen["host_rss_mib"].as_f64().unwrap_or(f64::NAN),
    ])
}

fn peer_side(p: &Value) -> [f64; 4] {
    let f = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
    [f("prefill_tok_s"), f("decode_tok_s_batch1"), f("aggregate_tok_s"), f("peak_rss_mib")]
}

fn peer_name(p: &Value) -> String {
    format!(
        "{} ({}, {} threads)",
        p["engine"].as_str().unwrap_or("llama.cpp"),
        p["device"].as_str().unwrap_or("?"),
        p["threads"]
    )
}

/// weft next to each peer on the same workload, then weft ÷ peer.
fn side_by_side(doc: &Value, peers: &[Value]) -> String {
    let prompt_len = peers[0]["prompt_len"].as_u64().unwrap_or(128);
    let gen_len = &peers[0]["gen_len"];
    let mut out = format!(
        "Side by side on the same GGUF, prompts of {prompt_len} tokens, {gen_len} generated, greedy \
         (`tools/peer_bench.py`: llama-cpp-python {}):\n\n",
        peers[0]["llama_cpp_python"].as_str().unwrap_or("?")
    );
    out.push_str(&format!(
        "| | prefill {prompt_len} tok/s | decode batch 1 tok/s | aggregate at 16 tok/s | peak RSS MiB | load average |\n|---|---:|---:|---:|---:|---|\n"
    ));
    let fmt = |v: f64, d: usize| if v.is_finite() { format!("{v:.d$}") } else { "–".into() };
    let row = |name: &str, v: [f64; 4], load: &Value| {
        format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            fmt(v[0], 1),
            fmt(v[1], 2),
            fmt(v[2], 2),
            fmt(v[3], 0),
            loads(load)
        )
    };
    let weft = weft_side(doc, prompt_len);
    let adapter = doc["adapter"]["name"].as_str().unwrap_or("?");
    if let Some(w) = weft {
        out.push_str(&row(&format!("weft ({adapter})"), w, &doc["measured"]["load_average_after"]));
    }
    for p in peers {
        out.push_str(&row(&peer_name(p), peer_side(p), &p["measured"]["load_average_after"]));
    }
    if let Some(w) = weft {
        for p in peers {
            let v = peer_side(p);
            let r: Vec<String> =
                (0..4).map(|i| if v[i] > 0.0 { format!("{:.2}×", w[i] / v[i]) } else { "–".into() }).collect();
            out.push_str(&format!(
                "| weft ÷ {} | {} | {} | {} | {} | |\n",
                p["engine"].as_str().unwrap_or("peer"),
                r[0],
                r[1],
                r[2],
                r[3]
            ));
        }
    }
    out
}

/// The ratios the issue asks for, one line per peer.
pub fn ratio_lines(doc: &Value) -> Vec<String> {
    let peers = doc["peers"].as_array().cloned().unwrap_or_default();
    let prompt_len = peers.first().and_then(|p| p["prompt_len"].as_u64()).unwrap_or(128);
    let Some(w) = weft_side(doc, prompt_len) else {
        return vec!["weft/llama.cpp: the weft set has no concurrency 1 and 16 at the peer's prompt length".into()];
    };
    peers
        .iter()
        .map(|p| {
            let v = peer_side(p);
            format!(
                "weft/{}: prefill {prompt_len} {:.2}×, decode batch 1 {:.2}×, aggregate at 16 {:.2}×",
                p["engine"].as_str().unwrap_or("peer"),
                w[0] / v[0],
                w[1] / v[1],
                w[2] / v[2]
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_sets_parse() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.set, Set::standard());
        assert!(!o.no_save);
        let q = parse(&args("--quick")).unwrap();
        assert_eq!(q.set, Set::quick());
        assert!(q.no_save, "a smoke check does not overwrite the saved results");
        let c = parse(&args("--concurrency 1,16 --prompt-len 128 --gen-len 32 --repeats 1 --peer")).unwrap();
        assert_eq!(
            (c.set.name.as_str(), c.set.concurrency.clone(), c.set.gen_len),
            ("standard (changed)", vec![1, 16], 32)
        );
        assert!(c.peer && !c.no_save);
        let q2 = parse(&args("--quick --repeats 2")).unwrap();
        assert_eq!((q2.set.name.as_str(), q2.set.repeats, q2.set.gen_len), ("quick (changed)", 2, 16));
        // The KV cache flags go to weft as given, and leave the set as it was.
        let kv = parse(&args("--kv-cache-dtype f16 --kv-memory 1GiB")).unwrap();
        assert_eq!(kv.kv_args, args("--kv-cache-dtype f16 --kv-memory 1GiB"));
        assert_eq!(kv.set, Set::standard());
    }

    #[test]
    fn bad_arguments_say_what_is_wrong() {
        let err = |s: &str| parse(&args(s)).unwrap_err();
        assert!(err("--concurrency 1,0").contains("positive whole number, not \"0\""));
        assert!(err("--gen-len").contains("--gen-len needs a value"));
        assert!(err("--frobnicate").contains("unknown argument \"--frobnicate\""));
        assert!(err("--peer --concurrency 1,4").contains("concurrency 1 and 16"));
    }

    #[test]
    fn slugs_and_dates() {
        assert_eq!(slug("llvmpipe (LLVM 15.0.6, 256 bits)"), "llvmpipe-llvm-15-0-6-256-bits");
        assert_eq!(slug("NVIDIA H200"), "nvidia-h200");
        assert_eq!(slug("()"), "unknown-adapter");
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        let lvp = "llvmpipe (LLVM 15.0.6, 256 bits)";
        assert_eq!(results_name(lvp, None, &Set::standard(), &[]), "llvmpipe-llvm-15-0-6-256-bits.json");
        let quick = Set::quick();
        let name = results_name(lvp, Some(Path::new("/m/Llama-3.2-1B.Q4_1.gguf")), &quick, &[]);
        assert_eq!(name, "llvmpipe-llvm-15-0-6-256-bits.llama-3-2-1b-q4-1.c1-4.p32.g16.r1.json");
        let f16 = results_name(lvp, None, &Set::standard(), &args("--kv-cache-dtype f16"));
        assert_eq!(f16, "llvmpipe-llvm-15-0-6-256-bits.kv-cache-dtype-f16.json");
        assert_eq!(utc_date(1_764_557_400), "2025-12-01 02:50 UTC");
    }

    fn doc() -> Value {
        let run = |c: u64, rss: f64| {
            json!({"concurrency": c, "prompt_len": 128, "gen_len": 32, "prefill_tok_s": 200.0, "decode_tok_s_per_seq": 8.0,
                   "aggregate_tok_s": 8.0 * c as f64, "ttft_ms_p50": 640.0, "ttft_ms_p99": 700.0, "itl_ms_p50": 125.0,
                   "itl_ms_p99": 150.0, "host_ms_per_step_p50": 1.5, "gpu_ms_per_step_p50": null, "gpu_mem_mib": 300.0, "host_rss_mib": rss})
        };
        json!({
            "adapter": {"name": "llvmpipe (LLVM 15.0.6, 256 bits)", "backend": "vulkan", "kernels": "cpu"},
            "model": "m.gguf", "repeats": 1, "runs": [run(1, 400.0), run(16, 500.0)],
            "set": {"name": "custom", "concurrency": [1, 16], "prompt_len": [128], "gen_len": 32, "repeats": 1},
            "measured": {"date": "2025-12-01 03:00 UTC", "weft_commit": "abc1234", "cpus": 2,
                         "load_average_before": [10.0, 9.5, 9.0], "load_average_after": [11.0, 10.0, 9.0], "duration_s": 60,
                         "kv_args": ["--kv-cache-dtype", "f16"]},
            "peers": [{"engine": "llama.cpp Vulkan", "device": "Vulkan0 (llvmpipe)", "threads": 2, "llama_cpp_python": "0.3.36",
                       "prompt_len": 128, "gen_len": 32, "prefill_tok_s": 10.0, "decode_tok_s_batch1": 2.0,
                       "aggregate_tok_s": 4.0, "peak_rss_mib": 550.0, "measured": {"load_average_after": [12.0, 11.0, 10.0]}}],
        })
    }

    #[test]
    fn the_tables_show_every_run_and_the_ratios() {
        let md = markdown_for(&doc());
        assert!(md.contains("Set **custom**: concurrency 1, 16 × prompts of 128 tokens, 32 generated"), "{md}");
        assert!(md.contains("at weft abc1234, weft run with `--kv-cache-dtype f16` on 2 CPUs, load average 10.00 / 9.50 / 9.00 before"), "{md}");
        assert!(
            md.contains("| 16 | 128 | 32 | 200.0 | 8.00 | 128.00 | 640 | 700 | 125.0 | 150.0 | 1.50 | – | 300 | 500 |"),
            "{md}"
        );
        assert!(md.contains("| weft (llvmpipe (LLVM 15.0.6, 256 bits)) | 200.0 | 8.00 | 128.00 | 500 |"), "{md}");
        assert!(md.contains("| weft ÷ llama.cpp Vulkan | 20.00× | 4.00× | 32.00× | 0.91× | |"), "{md}");
        assert_eq!(
            ratio_lines(&doc()),
            ["weft/llama.cpp Vulkan: prefill 128 20.00×, decode batch 1 4.00×, aggregate at 16 32.00×"]
        );
    }

    #[test]
    fn the_readme_keeps_its_text_around_the_markers() {
        let text = format!("# Bench\n\nhand-written\n\n{BEGIN_MARKER}\nold table\n{END_MARKER}\n\nmore text\n");
        let new = replace_between_markers(&text, &generated_section(&[("a.json".into(), doc())])).unwrap();
        assert!(new.starts_with("# Bench\n\nhand-written\n\n"));
        assert!(new.ends_with(&format!("{END_MARKER}\n\nmore text\n")));
        assert!(!new.contains("old table"));
        assert!(
            new.contains(
                "### llvmpipe (LLVM 15.0.6, 256 bits) (vulkan, cpu kernels), m.gguf\n\n`bench/results/a.json`"
            )
        );
        // Regenerating is stable.
        assert_eq!(replace_between_markers(&new, &generated_section(&[("a.json".into(), doc())])).unwrap(), new);
        assert!(replace_between_markers("no markers", "x").is_none());
    }
}
