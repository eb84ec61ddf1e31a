//! `cargo xtask web`: build the browser bundle into web/dist (the wasm crate through
//! wasm-bindgen, the page from web/www, the default model) and serve it on 127.0.0.1, or with
//! `--pack` make the npm package from it (`npm.rs`).
//! `cargo xtask test-web`: that build, then the page and the engine API in headless Chromium
//! (WebGPU on SwiftShader) against `weft generate`'s output, then the wasm-bindgen tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{MODEL_FILE, Result, cargo, fetch_model, root, run, rustup_target, target_dir, with_gpu_env};

const WASM_TARGET: &str = "wasm32-unknown-unknown";
/// The model file name the page loads by default, under dist/models/.
const MODEL_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `cargo xtask web [--build-only] [--port N] [--pack [DIR]]`
pub fn web(args: &[String]) -> Result {
    let mut build_only = false;
    let mut port = 8080;
    let mut pack_to = None;
    let mut args = args.iter().peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--build-only" => build_only = true,
            "--port" => {
                let value = args.next().ok_or("--port needs a number")?;
                port = value.parse().map_err(|_| format!("--port {value:?} is not a port number"))?;
            }
            "--pack" => {
                let dir = args.next_if(|a| !a.starts_with("--")).map(PathBuf::from);
                pack_to = Some(dir.unwrap_or_else(|| target_dir().join("npm")));
            }
            other => {
                return Err(format!(
                    "cargo xtask web: unknown argument {other:?} (takes --build-only, --port N, --pack [DIR])"
                ));
            }
        }
    }
    let dist = build()?;
    if let Some(dir) = pack_to {
        crate::npm::pack(&dist, &dir)?;
        return Ok(());
    }
    if build_only {
        return Ok(());
    }
    let listener = crate::serve::bind(port).map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("xtask: serving {} at http://{addr}/ (Ctrl-C stops)", dist.display());
    println!(
        "xtask: open http://{addr}/ in a browser with WebGPU (Chrome or Edge 113+; Chromium on Linux needs --enable-unsafe-webgpu)"
    );
    crate::serve::serve(listener, dist)
}

/// Build web/dist: pkg/ (wasm-bindgen's output), the files of web/www, models/<default model>.
pub fn build() -> Result<PathBuf> {
    let started = Instant::now();
    rustup_target(WASM_TARGET)?;
    let mut cmd = cargo();
    cmd.args(["build", "--release", "-p", "weft-web", "--target", WASM_TARGET, "--lib"]);
    run(cmd)?;
    let wasm = target_dir().join(WASM_TARGET).join("release").join("weft_web.wasm");
    if !wasm.exists() {
        return Err(format!(
            "{} is missing after the build (web/Cargo.toml needs crate-type \"cdylib\")",
            wasm.display()
        ));
    }

    let dist = root().join("web").join("dist");
    std::fs::create_dir_all(&dist).map_err(|e| format!("creating {}: {e}", dist.display()))?;
    // Start clean, except models/ (a hard link to a 98 MB file, kept between builds).
    for entry in std::fs::read_dir(&dist).map_err(|e| e.to_string())?.flatten() {
        if entry.file_name() == "models" {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        removed.map_err(|e| format!("removing {}: {e}", path.display()))?;
    }

    let bindgen = wasm_bindgen()?;
    let pkg = dist.join("pkg");
    let mut cmd = Command::new(&bindgen);
    cmd.args(["--target", "web", "--no-typescript", "--out-name", "weft_web", "--out-dir"]).arg(&pkg).arg(&wasm);
    run(cmd)?;
    wasm_opt(&pkg.join("weft_web_bg.wasm"))?;

    let www = root().join("web").join("www");
    if !www.is_dir() {
        return Err(format!("{} is missing: the page's files live there", www.display()));
    }
    copy_dir(&www, &dist)?;

    fetch_model()?;
    let model = dist.join("models").join(MODEL_NAME);
    link_or_copy(&root().join(MODEL_FILE), &model)?;

    println!("xtask: built {} in {:.1} s", dist.display(), started.elapsed().as_secs_f64());
    for (what, path) in
        [("wasm module", pkg.join("weft_web_bg.wasm")), ("JS glue", pkg.join("weft_web.js")), ("default model", model)]
    {
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!(
            "xtask:   {what:<14} {:>9.2} MB  {}",
            len as f64 / 1e6,
            path.strip_prefix(root()).unwrap_or(&path).display()
        );
    }
    let gzip = Command::new("gzip").arg("-9c").arg(pkg.join("weft_web_bg.wasm")).output();
    if let Some(out) = gzip.ok().filter(|o| o.status.success()) {
        println!("xtask:   {:<14} {:>9.2} MB  (wasm module, gzip -9)", "compressed", out.stdout.len() as f64 / 1e6);
    }
    Ok(dist)
}

/// The wasm-bindgen version in Cargo.lock: the CLI must match the library exactly.
fn locked_wasm_bindgen_version() -> Result<String> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).map_err(|e| format!("reading Cargo.lock: {e}"))?;
    lock_version(&lock, "wasm-bindgen")
        .ok_or_else(|| "Cargo.lock has no wasm-bindgen package (does web/Cargo.toml depend on it?)".into())
}

/// The version of package `name` in a Cargo.lock's text.
fn lock_version(lock: &str, name: &str) -> Option<String> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let version = lines.next()?.trim();
            return Some(version.strip_prefix("version = \"")?.strip_suffix('"')?.to_string());
        }
    }
    None
}

fn cargo_bin(name: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"));
    home.join("bin").join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// A program on PATH, else in cargo's bin directory.
fn find_tool(name: &str) -> Option<PathBuf> {
    let exe = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(&exe))
        .chain([cargo_bin(name)])
        .find(|p| p.is_file())
}

fn tool_version(path: &Path) -> Option<String> {
    let out = Command::new(path).arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1)?.to_string())
}

/// wasm-bindgen (and wasm-bindgen-test-runner beside it) at the locked version; installs
/// wasm-bindgen-cli with cargo when it is missing or another version.
fn wasm_bindgen() -> Result<PathBuf> {
    let version = locked_wasm_bindgen_version()?;
    if let Some(path) = find_tool("wasm-bindgen")
        && tool_version(&path).as_deref() == Some(version.as_str())
    {
        return Ok(path);
    }
    eprintln!("xtask: installing wasm-bindgen-cli {version} (the version in Cargo.lock; takes a few minutes once)");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["install", "wasm-bindgen-cli", "--version", &version]);
    run(cmd)?;
    let path = cargo_bin("wasm-bindgen");
    match tool_version(&path) {
        Some(v) if v == version => Ok(path),
        other => Err(format!("{} reports version {other:?} after installing {version}", path.display())),
    }
}

/// Optionally shrink the module with binaryen's wasm-opt: only the npm package `binaryen` in
/// web/e2e/node_modules (installed there when WEFT_WASM_OPT=1), never an older system one.
fn wasm_opt(module: &Path) -> Result {
    let e2e = root().join("web").join("e2e");
    let bin = e2e.join("node_modules").join(".bin").join("wasm-opt");
    if !bin.exists() {
        if std::env::var("WEFT_WASM_OPT").as_deref() != Ok("1") {
            return Ok(());
        }
        let mut npm = Command::new("npm");
        npm.current_dir(&e2e).args(["install", "--no-save", "--no-audit", "--no-fund", "binaryen"]);
        run(npm)?;
    }
    let before = std::fs::metadata(module).map(|m| m.len()).unwrap_or(0);
    let out = module.with_extension("opt.wasm");
    let mut cmd = Command::new(&bin);
    // The features rustc's wasm32-unknown-unknown target turns on by default.
    cmd.args(["-O2", "--enable-bulk-memory", "--enable-bulk-memory-opt", "--enable-nontrapping-float-to-int"])
        .args(["--enable-sign-ext", "--enable-mutable-globals", "--enable-reference-types", "--enable-multivalue"])
        .arg(module)
        .arg("-o")
        .arg(&out);
    run(cmd)?;
    std::fs::rename(&out, module).map_err(|e| e.to_string())?;
    let after = std::fs::metadata(module).map(|m| m.len()).unwrap_or(0);
    println!("xtask: wasm-opt -O2: {:.2} MB -> {:.2} MB", before as f64 / 1e6, after as f64 / 1e6);
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result {
    std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))?.flatten() {
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| format!("copying {} to {}: {e}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}

/// Put `from` at `to` as a hard link (a copy across file systems); nothing to do when a file of
/// the same size is already there.
fn link_or_copy(from: &Path, to: &Path) -> Result {
    let len = std::fs::metadata(from).map_err(|e| format!("{}: {e}", from.display()))?.len();
    if std::fs::metadata(to).is_ok_and(|m| m.len() == len) {
        return Ok(());
    }
    std::fs::create_dir_all(to.parent().unwrap()).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(to);
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(())
}

/// The prompts both sides answer, per model; the page shows four panes.
const TINY_PROMPTS: [&str; 4] =
    ["What is the capital of France?", "Name a prime number.", "Translate 'cat' to German.", "Tell me a story."];
const TINY_MAX_TOKENS: usize = 12;
const MODEL_PROMPTS: [&str; 4] =
    ["What is the capital of France?", "Write a haiku about the sea.", "List three colors.", "Why is the sky blue?"];
const MODEL_MAX_TOKENS: usize = 8;
/// Real models of other architectures, picked as local files on the page, a few tokens each
/// (SwiftShader runs them at about a token a second): Gemma 3, a base model whose GGUF has no
/// chat template (raw completions), and Qwen2.5-Coder 0.5B answering chat prompts.
const FILE_MODELS: [(&str, bool, &[&str]); 2] = [
    ("gemma-3-270m", false, &["The capital of France is", "def fibonacci(n):"]),
    ("qwen2.5-coder-0.5b-instruct", true, &["Write a Python function that adds two numbers."]),
];
const FILE_MODEL_MAX_TOKENS: usize = 3;

/// `cargo xtask test-web`
pub fn test_web() -> Result {
    let started = Instant::now();
    let mut step = Instant::now();
    let mut lap = |what: &str| {
        println!("xtask: test-web: {what} took {:.1} s", step.elapsed().as_secs_f64());
        step = Instant::now();
    };
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let chromedriver = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let tools = [
        (chromium.as_str(), "chromium"),
        (chromedriver.as_str(), "chromium-driver"),
        ("node", "nodejs"),
        ("npm", "npm"),
    ];
    ensure_apt_tools(&tools, "the browser tests")
        .map_err(|e| format!("{e} (set CHROMIUM / CHROMEDRIVER to use other paths)"))?;

    let dist = build()?;
    lap("building web/dist");

    let out_dir = target_dir().join("web-test");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let tiny = out_dir.join("tiny.gguf");
    let mut example = cargo();
    example.args(["run", "--release", "--quiet", "--example", "tiny_model", "--"]).arg(&tiny);
    run(example)?;
    let big = big_model(&out_dir)?;
    let mut native = cargo();
    native.args(["build", "--release", "-p", "weft-native"]);
    run(native)?;
    let weft = target_dir().join("release").join(format!("weft{}", std::env::consts::EXE_SUFFIX));
    let model = root().join(MODEL_FILE);
    let mut file_models = Vec::new();
    for (name, chat, prompts) in FILE_MODELS {
        let spec = crate::model_spec(name)?;
        crate::fetch(spec)?;
        let path = root().join("models").join(spec.file);
        file_models.push(references(&weft, &path, "", prompts, FILE_MODEL_MAX_TOKENS, chat)?);
    }
    let expected = format!(
        "{{\n  \"tiny\": {},\n  \"smollm2\": {},\n  \"files\": [{}]\n}}\n",
        references(&weft, &tiny, "/test/tiny.gguf", &TINY_PROMPTS, TINY_MAX_TOKENS, true)?,
        references(&weft, &model, &format!("/models/{MODEL_NAME}"), &MODEL_PROMPTS, MODEL_MAX_TOKENS, true)?,
        file_models.join(", "),
    );
    let expected_path = out_dir.join("expected.json");
    std::fs::write(&expected_path, &expected).map_err(|e| e.to_string())?;
    lap("native reference outputs");

    let e2e = root().join("web").join("e2e");
    if !["playwright-core", "typescript", "vite"].iter().all(|m| e2e.join("node_modules").join(m).is_dir()) {
        let mut npm = Command::new("npm");
        let lock = e2e.join("package-lock.json").exists();
        npm.current_dir(&e2e).args(if lock {
            &["ci", "--no-audit", "--no-fund"][..]
        } else {
            &["install", "--no-audit", "--no-fund"][..]
        });
        // playwright-core never downloads a browser; this keeps it so should that change.
        npm.env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1");
        run(npm)?;
    }
    let npm_dir = out_dir.join("npm");
    let tarball = crate::npm::pack(&dist, &npm_dir.join("pack"))?;
    let types_result = crate::npm::check(&tarball, &npm_dir, &e2e)
        .map_err(|e| format!("the npm package's types failed their check: {e}"));
    let apps = crate::npm::build_examples(&tarball, &npm_dir, &e2e)
        .map_err(|e| format!("the example apps could not be built from the npm package: {e}"));
    lap("npm package, its types and the example apps");
    let mut node = Command::new("node");
    node.current_dir(root()).arg(e2e.join("run.mjs"));
    node.env("WEFT_DIST", &dist)
        .env("WEFT_E2E", &e2e)
        .env("WEFT_EXPECTED", &expected_path)
        .env("WEFT_TINY_MODEL", &tiny)
        .env("WEFT_BIG_MODEL", &big)
        .env("CHROMIUM", &chromium)
        .env("WEFT_SHOTS", &out_dir);
    if let Ok((app, built)) = &apps {
        node.env("WEFT_NPM_APP", app).env("WEFT_VITE_APP", built);
    }
    let node_result = run(node).map_err(|e| format!("the browser tests in web/e2e failed: {e}"));
    lap("browser tests (web/e2e/run.mjs)");

    // The web crate's own tests, compiled to wasm and run by wasm-bindgen-test-runner in the same
    // headless Chromium through chromedriver (flags in web/webdriver.json).
    let bindgen = wasm_bindgen()?;
    let runner = bindgen.with_file_name(format!("wasm-bindgen-test-runner{}", std::env::consts::EXE_SUFFIX));
    let mut cmd = cargo();
    cmd.args(["test", "--release", "-p", "weft-web", "--target", WASM_TARGET, "--tests"]);
    cmd.env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER", &runner)
        .env("CHROMEDRIVER", &chromedriver)
        .env("WASM_BINDGEN_TEST_WEBDRIVER_JSON", root().join("web").join("webdriver.json"))
        .env("WASM_BINDGEN_TEST_TIMEOUT", std::env::var("WASM_BINDGEN_TEST_TIMEOUT").unwrap_or_else(|_| "1200".into()))
        .env("WASM_BINDGEN_USE_BROWSER", "1");
    let wasm_result = run(cmd).map_err(|e| format!("the wasm-bindgen tests of weft-web failed: {e}"));
    lap("wasm-bindgen tests");
    println!("xtask: test-web took {:.1} s in all", started.elapsed().as_secs_f64());
    types_result.and(apps.map(drop)).and(node_result).and(wasm_result)
}

/// The model the bounded-loading case loads (web/e2e/run.mjs, "a model larger than WebAssembly
/// memory holds"): random weights in Llama 3.2 1B's shape, Q4_1, 775 MB; with `WEFT_FULL=1`
/// Llama 3.1 8B's, 5.0 GB (the browser test picks it as a file), more than a wasm32 heap can hold at all. Written once (the same
/// command writes the same file).
fn big_model(out_dir: &Path) -> Result<PathBuf> {
    let shape = if std::env::var("WEFT_FULL").as_deref() == Ok("1") { "llama-3.1-8b" } else { "llama-3.2-1b" };
    let path = out_dir.join(format!("big-{shape}.q4_1.gguf"));
    if !path.exists() {
        let partial = path.with_extension("partial");
        let mut cmd = cargo();
        cmd.args(["run", "--release", "--quiet", "-p", "weft", "--example", "make_model", "--"])
            .args(["--shape", shape, "--quant", "q4_1", "--tokenizer-from"])
            .arg(root().join(MODEL_FILE))
            .arg("--out")
            .arg(&partial);
        run(cmd)?;
        std::fs::rename(&partial, &path).map_err(|e| format!("renaming {}: {e}", partial.display()))?;
    }
    Ok(path)
}

/// `weft generate --temperature 0` (with `--chat` when `chat`) on every prompt, in one process
/// (`--prompts-file`: the prompts share its steps, which changes no token): the text the page
/// must show, as JSON (with `chat`: the page sends chat models' prompts as chat messages).
fn references(weft: &Path, model: &Path, url: &str, prompts: &[&str], max_tokens: usize, chat: bool) -> Result<String> {
    let list_path = target_dir().join("web-test").join("prompts.txt");
    std::fs::write(&list_path, prompts.join("\n")).map_err(|e| format!("writing {}: {e}", list_path.display()))?;
    let mut cmd = Command::new(weft);
    cmd.arg("generate").arg("--model").arg(model).arg("--prompts-file").arg(&list_path).args(["--temperature", "0"]);
    if chat {
        cmd.arg("--chat");
    }
    cmd.args(["--max-tokens", &max_tokens.to_string()]);
    let out = with_gpu_env(cmd).output().map_err(|e| format!("running {}: {e}", weft.display()))?;
    if !out.status.success() {
        return Err(format!("weft generate failed on {}: {}", model.display(), String::from_utf8_lossy(&out.stderr)));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut outputs = Vec::new();
    for (prompt, line) in prompts.iter().zip(stdout.lines()) {
        let reply: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("weft generate printed {line:?}, not a JSON line: {e}"))?;
        let text = reply["text"].as_str().ok_or_else(|| format!("weft generate's line {line:?} has no text"))?;
        println!("xtask: native {}: {prompt:?} -> {text:?}", model.file_name().unwrap_or_default().to_string_lossy());
        outputs.push(text.to_string());
    }
    if outputs.len() != prompts.len() {
        return Err(format!("weft generate answered {} of {} prompts: {stdout}", outputs.len(), prompts.len()));
    }
    let list = |items: &mut dyn Iterator<Item = String>| items.collect::<Vec<_>>().join(", ");
    Ok(format!(
        "{{\"model\": {}, \"url\": {}, \"maxTokens\": {max_tokens}, \"chat\": {chat}, \"prompts\": [{}], \"outputs\": [{}]}}",
        json_string(&model.to_string_lossy()),
        json_string(url),
        list(&mut prompts.iter().map(|p| json_string(p))),
        list(&mut outputs.iter().map(|o| json_string(o))),
    ))
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Each (program, Debian package): when a program is missing, install its package with apt as
/// root on Debian/Ubuntu, else say what `needed_by` needs installed.
pub fn ensure_apt_tools(tools: &[(&str, &str)], needed_by: &str) -> Result {
    let missing: Vec<&str> =
        tools.iter().filter(|(program, _)| !program_exists(program)).map(|(_, package)| *package).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !(is_root && Path::new("/usr/bin/apt-get").exists()) {
        return Err(format!(
            "{needed_by} need {}: on Debian/Ubuntu `sudo apt-get install -y {}`",
            missing.join(", "),
            missing.join(" ")
        ));
    }
    eprintln!("xtask: installing {} for {needed_by}", missing.join(" "));
    let mut update = Command::new("apt-get");
    update.args(["update", "-qq"]);
    run(update)?;
    let mut install = Command::new("apt-get");
    install.args(["install", "-y", "-qq"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive");
    run(install)
}

fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|dir| dir.join(program).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_versions_from_cargo_lock() {
        let lock = "[[package]]\nname = \"wasm-bindgen-futures\"\nversion = \"0.4.80\"\n\n[[package]]\nname = \"wasm-bindgen\"\nversion = \"0.2.130\"\nsource = \"registry\"\n";
        assert_eq!(lock_version(lock, "wasm-bindgen").as_deref(), Some("0.2.130"));
        assert_eq!(lock_version(lock, "wasm-bindgen-futures").as_deref(), Some("0.4.80"));
        assert_eq!(lock_version(lock, "js-sys"), None);
    }

    #[test]
    fn json_strings_escape_what_json_needs() {
        assert_eq!(json_string("a\"b\\c\nd\te\u{1a}é\u{fffd}"), "\"a\\\"b\\\\c\\nd\\te\\u001aé\u{fffd}\"");
    }
}
