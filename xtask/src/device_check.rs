//! `cargo xtask bench --device-check`: the GPU check, prepared for a machine with an NVIDIA GPU
//! and only what the repository carries. It hides every Vulkan driver but NVIDIA's (so neither
//! weft nor llama.cpp can fall back to lavapipe), builds weft in release, writes the Llama 3.2 1B
//! and Llama 3.1 8B shapes with random weights, runs the standard set (one repeat) on the
//! default model and both shapes, and llama.cpp's Vulkan build on the default model when its
//! venv is already built (`--peer` builds it first, outside the time budget), then prints one
//! table. Each part gets a share of what is left of the budget (default 450 s from the start,
//! build included) and is ended when it runs past it; the table says which parts did not finish.
//! Results (the JSON of each part and the table) go to `--out` (default target/device-check).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bench::{Set, build_weft, run_weft, utc_now};
use crate::peer::{self, PeerKind};
use crate::{MODEL_FILE, Result, VULKAN_ICD_DIRS, cargo, fetch_model, root, run, target_dir};

const USAGE: &str = "cargo xtask bench --device-check [--out DIR] [--budget SECONDS] [--peer]";

/// The shapes written and benchmarked besides the default model, in Q4_1 like it.
const SHAPES: [&str; 2] = ["llama-3.2-1b", "llama-3.1-8b"];

/// An NVIDIA Vulkan driver's manifest (`nvidia_icd.json`), if one is installed.
pub fn nvidia_icd(dirs: &[&Path]) -> Option<PathBuf> {
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut manifests: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        manifests.sort();
        for path in manifests.into_iter().filter(|p| p.extension().is_some_and(|x| x == "json")) {
            let name = path.file_name().unwrap_or_default().to_string_lossy().to_lowercase();
            let text = std::fs::read_to_string(&path).unwrap_or_default().to_lowercase();
            if name.contains("nvidia") || text.contains("libglx_nvidia") || text.contains("libnvidia") {
                return Some(path);
            }
        }
    }
    None
}

/// Why there is nothing to check here, and what would make it work.
fn no_nvidia_message() -> String {
    let smi = Command::new("nvidia-smi").arg("-L").output().ok().filter(|o| o.status.success());
    let mut msg = format!(
        "--device-check needs an NVIDIA GPU with its Vulkan driver, and no NVIDIA Vulkan driver manifest \
         (nvidia_icd.json) is installed under {}",
        VULKAN_ICD_DIRS.join(", ")
    );
    match smi {
        Some(o) => msg.push_str(&format!(
            ".\nnvidia-smi sees {}: install the driver's Vulkan part (Debian: nvidia-vulkan-icd; in a container \
             NVIDIA_DRIVER_CAPABILITIES must include graphics)",
            String::from_utf8_lossy(&o.stdout).trim()
        )),
        None => msg.push_str(" and nvidia-smi finds no GPU.\nOn this machine run `cargo xtask bench` (lavapipe or the GPU present) instead"),
    }
    msg
}

/// One part of the check and how it ended.
struct Part {
    name: String,
    outcome: std::result::Result<Value, String>,
    seconds: f64,
}

pub fn device_check(args: &[String]) -> Result {
    let mut out = target_dir().join("device-check");
    let mut budget = Duration::from_secs(450);
    let mut build_peer = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\nusage: {USAGE}"));
        match flag.as_str() {
            "--out" => out = PathBuf::from(value()?),
            "--budget" => {
                let v = value()?;
                budget = Duration::from_secs(v.parse().map_err(|_| format!("--budget takes seconds, not {v:?}"))?);
            }
            "--peer" => build_peer = true,
            other => return Err(format!("unknown argument {other:?}\nusage: {USAGE}")),
        }
    }
    let dirs: Vec<&Path> = VULKAN_ICD_DIRS.iter().map(Path::new).collect();
    let icd = nvidia_icd(&dirs).ok_or_else(no_nvidia_message)?;
    let started = Instant::now();
    let deadline = started + budget;
    eprintln!("xtask: device check with the Vulkan driver {} only, {} s budget", icd.display(), budget.as_secs());
    let icd_text = icd.display().to_string();
    // Only NVIDIA's driver is visible: weft cannot pick lavapipe, and ggml's device 0 is the GPU.
    let env: Vec<(&str, &str)> =
        vec![("VK_ICD_FILENAMES", icd_text.as_str()), ("WGPU_BACKEND", "vulkan"), ("GGML_VK_VISIBLE_DEVICES", "0")];
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;

    fetch_model()?;
    let weft = build_weft()?;
    let peer_python = if build_peer { Some(peer::ensure(PeerKind::Vulkan)?) } else { peer::ready(PeerKind::Vulkan) };
    let mut models = vec![("default".to_string(), root().join(MODEL_FILE))];
    let mut parts = Vec::new();
    let mut build = cargo();
    build.args(["build", "--release", "--example", "make_model"]);
    run(build)?;
    for shape in SHAPES {
        let path = target_dir().join("models").join(format!("{shape}.q4_1.gguf"));
        let began = Instant::now();
        let made = if path.exists() { Ok(()) } else { make_model(shape, "q4_1", &path, left(deadline, 4)) };
        match made {
            Ok(()) => models.push((shape.to_string(), path)),
            Err(e) => parts.push(Part {
                name: format!("make {shape}"),
                outcome: Err(e),
                seconds: began.elapsed().as_secs_f64(),
            }),
        }
    }

    // Short prompts on every model first, then the long ones: what finishes first matters most.
    // The default model's short prompts also run on the baseline kernels (workgroup-tiled
    // prefill) beside the adapter's own family (subgroup kernels on NVIDIA), to choose between
    // them from this table.
    let standard = Set::standard();
    let mut plan: Vec<(String, PathBuf, usize, Option<&str>)> = Vec::new();
    for &prompt_len in &standard.prompt_len {
        for (name, path) in &models {
            plan.push((name.clone(), path.clone(), prompt_len, None));
        }
        if prompt_len == standard.prompt_len[0] {
            plan.push(("default".into(), root().join(MODEL_FILE), prompt_len, Some("baseline")));
        }
    }
    let peer_parts = usize::from(peer_python.is_some());
    for (i, (name, path, prompt_len, kernels)) in plan.iter().enumerate() {
        let set =
            Set { name: "standard, 1 repeat".into(), prompt_len: vec![*prompt_len], repeats: 1, ..Set::standard() };
        let began = Instant::now();
        let timeout = left(deadline, plan.len() - i + peer_parts);
        let mut part_env = env.clone();
        part_env.extend(kernels.map(|k| ("WEFT_KERNELS", k)));
        let outcome = weft_part(&weft, path, &set, &part_env, timeout);
        let suffix = kernels.map_or(String::new(), |k| format!(".{k}"));
        if let Ok(doc) = &outcome {
            let file = out.join(format!("weft.{name}.p{prompt_len}{suffix}.json"));
            let _ = std::fs::write(&file, serde_json::to_string_pretty(doc).unwrap_or_default());
        }
        let kernels = kernels.map_or(String::new(), |k| format!(" ({k} kernels)"));
        parts.push(Part {
            name: format!("weft {name} p{prompt_len}{kernels}"),
            outcome,
            seconds: began.elapsed().as_secs_f64(),
        });
    }
    match &peer_python {
        Some(python) => {
            let began = Instant::now();
            let outcome = peer::measure(
                PeerKind::Vulkan,
                python,
                &root().join(MODEL_FILE),
                128,
                128,
                16,
                1,
                &env,
                Some(left(deadline, 1)),
            );
            if let Ok(v) = &outcome {
                let _ =
                    std::fs::write(out.join("peer.vulkan.json"), serde_json::to_string_pretty(v).unwrap_or_default());
            }
            parts.push(Part {
                name: "llama.cpp Vulkan default p128".into(),
                outcome,
                seconds: began.elapsed().as_secs_f64(),
            });
        }
        None => parts.push(Part {
            name: "llama.cpp Vulkan".into(),
            outcome: Err(format!(
                "not built here (its venv under {} is missing; --peer builds it)",
                peer::peer_dir().display()
            )),
            seconds: 0.0,
        }),
    }
    let table = table(&parts, started.elapsed().as_secs_f64());
    println!("{table}");
    let file = out.join("device-check.md");
    std::fs::write(&file, &table).map_err(|e| format!("writing {}: {e}", file.display()))?;
    eprintln!("xtask: wrote {} and the JSON of each part beside it", file.display());
    Ok(())
}

/// An equal share of the time left for the `parts_left` parts still to run (at least 10 s).
fn left(deadline: Instant, parts_left: usize) -> Duration {
    let rest = deadline.saturating_duration_since(Instant::now());
    (rest / parts_left.max(1) as u32).max(Duration::from_secs(10))
}

fn make_model(shape: &str, quant: &str, path: &Path, timeout: Duration) -> Result {
    let example = target_dir().join("release").join("examples").join("make_model");
    let mut cmd = Command::new(example);
    cmd.args(["--shape", shape, "--quant", quant, "--tokenizer-from"])
        .arg(root().join(MODEL_FILE))
        .arg("--out")
        .arg(path);
    peer::output_within(cmd, Some(timeout)).map(|_| ())
}

/// One `weft bench` run on the NVIDIA adapter (an error when weft picked another).
fn weft_part(weft: &Path, model: &Path, set: &Set, env: &[(&str, &str)], timeout: Duration) -> Result<Value> {
    // Room for every sequence of the biggest run at once, so nothing is preempted.
    let doc = run_weft(weft, model, set, &["--kv-memory".into(), "8GiB".into()], env, Some(timeout))?;
    let adapter = doc["adapter"]["name"].as_str().unwrap_or("");
    if !adapter.to_lowercase().contains("nvidia") {
        return Err(format!("weft ran on {adapter:?}, not the NVIDIA GPU"));
    }
    Ok(doc)
}

/// One table: a row per run of every part, then the parts that failed or ran out of time.
fn table(parts: &[Part], elapsed_s: f64) -> String {
    let mut out = String::from(
        "| what | adapter | conc | prompt | gen | prefill tok/s | decode tok/s/seq | aggregate tok/s | GPU ms/step | GPU MiB |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let num = |v: &Value, d: usize| v.as_f64().map_or("–".to_string(), |x| format!("{x:.d$}"));
    let mut problems = Vec::new();
    for p in parts {
        match &p.outcome {
            Ok(doc) if doc["runs"].is_array() => {
                let adapter = doc["adapter"]["name"].as_str().unwrap_or("?");
                for r in doc["runs"].as_array().into_iter().flatten() {
                    out.push_str(&format!(
                        "| {} | {adapter} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        p.name,
                        r["concurrency"],
                        r["prompt_len"],
                        r["gen_len"],
                        num(&r["prefill_tok_s"], 1),
                        num(&r["decode_tok_s_per_seq"], 1),
                        num(&r["aggregate_tok_s"], 1),
                        num(&r["gpu_ms_per_step_p50"], 2),
                        num(&r["gpu_mem_mib"], 0)
                    ));
                }
            }
            Ok(peer) => {
                out.push_str(&format!(
                    "| {} | {} | 1 / 16 | {} | {} | {} | {} (batch 1) | {} (16 seqs) | – | – |\n",
                    p.name,
                    peer["device"].as_str().unwrap_or("?"),
                    peer["prompt_len"],
                    peer["gen_len"],
                    num(&peer["prefill_tok_s"], 1),
                    num(&peer["decode_tok_s_batch1"], 1),
                    num(&peer["aggregate_tok_s"], 1)
                ));
            }
            Err(e) => problems.push(format!("- {} ({:.0} s): {e}", p.name, p.seconds)),
        }
    }
    out.push_str(&format!("\n{} parts in {elapsed_s:.0} s, {}.\n", parts.len(), utc_now()));
    if !problems.is_empty() {
        out.push_str("\nNot finished:\n");
        out.push_str(&problems.join("\n"));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nvidia_manifest_is_found_and_lavapipe_is_not_it() {
        let dir = std::env::temp_dir().join(format!("weft-xtask-icd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lvp_icd.x86_64.json"), r#"{"ICD": {"library_path": "/usr/lib/libvulkan_lvp.so"}}"#)
            .unwrap();
        assert_eq!(nvidia_icd(&[dir.as_path()]), None);
        std::fs::write(dir.join("nvidia_icd.json"), r#"{"ICD": {"library_path": "libGLX_nvidia.so.0"}}"#).unwrap();
        assert_eq!(nvidia_icd(&[Path::new("/nonexistent"), dir.as_path()]), Some(dir.join("nvidia_icd.json")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_table_lists_runs_and_what_did_not_finish() {
        let doc = serde_json::json!({"adapter": {"name": "NVIDIA H200"}, "runs": [
            {"concurrency": 1, "prompt_len": 128, "gen_len": 128, "prefill_tok_s": 5000.0, "decode_tok_s_per_seq": 300.0,
             "aggregate_tok_s": 290.0, "gpu_ms_per_step_p50": 1.25, "gpu_mem_mib": 900.0}]});
        let parts = [
            Part { name: "weft default p128".into(), outcome: Ok(doc), seconds: 20.0 },
            Part { name: "weft llama-3.1-8b p512".into(), outcome: Err("ran past its 60 s".into()), seconds: 60.0 },
        ];
        let t = table(&parts, 80.0);
        assert!(
            t.contains("| weft default p128 | NVIDIA H200 | 1 | 128 | 128 | 5000.0 | 300.0 | 290.0 | 1.25 | 900 |"),
            "{t}"
        );
        assert!(t.contains("- weft llama-3.1-8b p512 (60 s): ran past its 60 s"), "{t}");
    }
}
