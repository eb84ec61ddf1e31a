//! The npm package `weft-llm`: web/npm (package.json, the hand-written index.d.ts, its README,
//! typed examples) filled with web/dist's files, packed by `npm pack`; and the check
//! `cargo xtask test-web` runs on it: the typed example compiles under `tsc --strict`, a
//! misspelled call does not, and every file the package's JavaScript points at is inside it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, root, run};

const NAME: &str = "weft-llm";
/// web/npm/package.json holds this version; the package gets the weft-web crate's instead, so
/// the two never disagree.
const TEMPLATE_VERSION: &str = "\"version\": \"0.0.0\"";
/// The misspelled properties in example/example-wrong.ts: tsc must name each one.
const MISSPELLED: [&str; 2] = ["modelURL", "max_token"];

fn template() -> PathBuf {
    root().join("web").join("npm")
}

/// The weft-web crate's version (the workspace's, when the crate inherits it).
pub fn version() -> Result<String> {
    let read = |path: PathBuf| std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()));
    let web = read(root().join("web").join("Cargo.toml"))?;
    let found = match toml_version(&web, "package") {
        Some(v) if v != "workspace" => Some(v),
        _ => toml_version(&read(root().join("Cargo.toml"))?, "workspace.package"),
    };
    found.ok_or_else(|| "no version for weft-web in web/Cargo.toml or the workspace's Cargo.toml".into())
}

/// `version` under `[section]` of a Cargo.toml's text: the string, or "workspace" for
/// `version.workspace = true`.
fn toml_version(text: &str, section: &str) -> Option<String> {
    let header = format!("[{section}]");
    let mut lines = text.lines().map(str::trim).skip_while(|l| *l != header).skip(1);
    lines.find_map(|line| {
        if line.starts_with('[') {
            return Some(None);
        }
        let (key, value) = line.split_once('=')?;
        match key.trim() {
            "version" => Some(value.trim().strip_prefix('"')?.strip_suffix('"').map(str::to_string)),
            "version.workspace" if value.trim() == "true" => Some(Some("workspace".into())),
            _ => None,
        }
    })?
}

/// Fill `dir` (emptied first) with the package: the files package.json lists, from web/npm where
/// they are written by hand, else from `dist`; package.json with the crate's version.
pub fn assemble(dist: &Path, dir: &Path) -> Result<String> {
    let version = version()?;
    let manifest_path = template().join("package.json");
    let manifest = std::fs::read_to_string(&manifest_path).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    if !manifest.contains(TEMPLATE_VERSION) {
        return Err(format!("{} must hold {TEMPLATE_VERSION}, which the build replaces", manifest_path.display()));
    }
    let parsed: serde_json::Value =
        serde_json::from_str(&manifest).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let files =
        parsed["files"].as_array().ok_or_else(|| format!("{} has no \"files\" list", manifest_path.display()))?;

    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    for file in files {
        let file = file.as_str().ok_or_else(|| format!("{}: \"files\" holds a non-string", manifest_path.display()))?;
        let from = [template().join(file), dist.join(file)].into_iter().find(|p| p.is_file()).ok_or_else(|| {
            format!("{file} (listed in web/npm/package.json) is in neither web/npm nor {}", dist.display())
        })?;
        let to = dir.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).map_err(|e| e.to_string())?;
        std::fs::copy(&from, &to).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    let manifest = manifest.replace(TEMPLATE_VERSION, &format!("\"version\": \"{version}\""));
    std::fs::write(dir.join("package.json"), manifest).map_err(|e| e.to_string())?;
    shipped_references(dir)?;
    Ok(version)
}

/// Assemble the package under `out` and `npm pack` it there: the tarball's path.
pub fn pack(dist: &Path, out: &Path) -> Result<PathBuf> {
    let staging = out.join(NAME);
    let version = assemble(dist, &staging)?;
    let tarball = out.join(format!("{NAME}-{version}.tgz"));
    let _ = std::fs::remove_file(&tarball);
    let mut npm = Command::new("npm");
    npm.current_dir(&staging).args(["pack", "--silent", "--pack-destination"]).arg(out);
    run(npm)?;
    let len = std::fs::metadata(&tarball).map_err(|e| format!("npm pack wrote no {}: {e}", tarball.display()))?.len();
    println!("xtask: packed {} ({:.2} MB)", tarball.display(), len as f64 / 1e6);
    Ok(tarball)
}

/// Every `new URL('./…', import.meta.url)` and `import('./…')` in the package's JavaScript names
/// a file the package holds: what a bundler or a browser will ask for.
fn shipped_references(dir: &Path) -> Result {
    let mut pending = vec![PathBuf::from("weft.js")];
    let mut seen = Vec::new();
    while let Some(file) = pending.pop() {
        if seen.contains(&file) {
            continue;
        }
        let path = dir.join(&file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("the package lacks {}, which its JavaScript loads: {e}", file.display()))?;
        let base = file.parent().unwrap_or(Path::new("")).to_path_buf();
        for target in relative_references(&text) {
            let next = base.join(target.trim_start_matches("./"));
            if next.extension().is_some_and(|e| e == "js") {
                pending.push(next);
            } else if !dir.join(&next).is_file() {
                return Err(format!("{} loads {target}, which the package lacks", file.display()));
            }
        }
        seen.push(file);
    }
    Ok(())
}

/// The relative paths a script loads: `import … from './x'`, `import('./x')`, and
/// `new URL('./x', import.meta.url)` (also wasm-bindgen's `new URL('x_bg.wasm', …)`).
fn relative_references(js: &str) -> Vec<String> {
    let mut found = Vec::new();
    for opener in ["from '", "import('", "new URL('"] {
        for (at, _) in js.match_indices(opener) {
            let rest = &js[at + opener.len()..];
            let Some(end) = rest.find('\'') else { continue };
            let target = &rest[..end];
            let after = &rest[end + 1..];
            let local = target.starts_with("./") || (opener == "new URL('" && !target.contains(':'));
            let from_here = opener != "new URL('" || after.trim_start().starts_with(", import.meta.url");
            if local && from_here && !target.is_empty() && !found.iter().any(|f| f == target) {
                found.push(target.to_string());
            }
        }
    }
    found
}

/// The package, unpacked into a node_modules, checked with `tsc` from web/e2e: example.ts
/// compiles under --strict, example-wrong.ts fails naming each misspelled property, and the
/// entry imports in node.
pub fn check(tarball: &Path, work: &Path, e2e: &Path) -> Result {
    let tsc = e2e.join("node_modules").join(".bin").join("tsc");
    if !tsc.exists() {
        return Err(format!("{} is missing (typescript is a devDependency of web/e2e: npm ci there)", tsc.display()));
    }
    let project = work.join("types");
    let installed = project.join("node_modules").join(NAME);
    if project.exists() {
        std::fs::remove_dir_all(&project).map_err(|e| format!("removing {}: {e}", project.display()))?;
    }
    std::fs::create_dir_all(&installed).map_err(|e| e.to_string())?;
    let mut tar = Command::new("tar");
    tar.arg("-xzf").arg(tarball).arg("-C").arg(&installed).arg("--strip-components=1");
    run(tar)?;
    for file in ["example.ts", "example-wrong.ts"] {
        let from = template().join("example").join(file);
        std::fs::copy(&from, project.join(file)).map_err(|e| format!("copying {}: {e}", from.display()))?;
    }

    let compile = |file: &str| {
        let mut cmd = Command::new(&tsc);
        cmd.current_dir(&project).args(["--noEmit", "--strict", "--target", "es2022", "--module", "esnext"]);
        cmd.args(["--moduleResolution", "bundler", "--lib", "es2022,dom,dom.iterable", file]);
        eprintln!("xtask: running {cmd:?}");
        cmd.output().map_err(|e| format!("could not start {}: {e}", tsc.display()))
    };
    let good = compile("example.ts")?;
    if !good.status.success() {
        return Err(format!(
            "tsc --strict rejects web/npm/example/example.ts against the package's index.d.ts:\n{}",
            String::from_utf8_lossy(&good.stdout)
        ));
    }
    let wrong = compile("example-wrong.ts")?;
    let said = String::from_utf8_lossy(&wrong.stdout);
    let unnamed: Vec<&str> = MISSPELLED.iter().copied().filter(|p| !said.contains(&format!("'{p}'"))).collect();
    if wrong.status.success() || !unnamed.is_empty() {
        return Err(format!(
            "tsc must reject web/npm/example/example-wrong.ts naming {MISSPELLED:?}, but it {} and did not name {unnamed:?}:\n{said}",
            if wrong.status.success() { "passed" } else { "failed" }
        ));
    }
    println!("xtask: tsc rejects the misspelled calls as it should:\n{}", said.trim_end());

    let mut node = Command::new("node");
    node.current_dir(&project).args(["--input-type=module", "-e"]).arg(format!(
        "const m = await import('{NAME}'); for (const f of ['createEngine', 'webgpuStatus', 'WeftError', 'WeftEngine', 'WeftStream']) \
         if (typeof m[f] !== 'function') throw new Error(`{NAME} exports no ${{f}}`);"
    ));
    run(node)
}

/// The two example apps, as a user's would be: web/npm/example/vite with the tarball installed
/// by `npm install ./weft-llm-x.y.z.tgz`, built by `vite build` (web/e2e's devDependency) with
/// no configuration for the page to be served at `/vite/`; and example/plain.html beside that
/// node_modules, unbundled. The app's directory (plain.html and node_modules) and the built one.
pub fn build_examples(tarball: &Path, work: &Path, e2e: &Path) -> Result<(PathBuf, PathBuf)> {
    let vite = e2e.join("node_modules").join(".bin").join("vite");
    if !vite.exists() {
        return Err(format!("{} is missing (vite is a devDependency of web/e2e: npm ci there)", vite.display()));
    }
    let app = work.join("vite-app");
    if app.exists() {
        std::fs::remove_dir_all(&app).map_err(|e| format!("removing {}: {e}", app.display()))?;
    }
    std::fs::create_dir_all(&app).map_err(|e| e.to_string())?;
    let example = template().join("example").join("vite");
    for file in ["index.html", "main.js", "package.json"] {
        let from = example.join(file);
        std::fs::copy(&from, app.join(file)).map_err(|e| format!("copying {}: {e}", from.display()))?;
    }
    let plain = template().join("example").join("plain.html");
    std::fs::copy(&plain, app.join("plain.html")).map_err(|e| format!("copying {}: {e}", plain.display()))?;
    let mut install = Command::new("npm");
    install.current_dir(&app).args(["install", "--no-audit", "--no-fund"]).arg(tarball);
    run(install)?;
    let out = app.join("dist");
    let mut build = Command::new(&vite);
    build.current_dir(&app).args(["build", "--base", "/vite/", "--logLevel", "warn", "--outDir"]).arg(&out);
    run(build)?;
    let mut files = Vec::new();
    let mut pending = vec![out.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let len = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
                files.push(format!(
                    "{} ({:.1} kB)",
                    path.strip_prefix(&out).unwrap_or(&path).display(),
                    len as f64 / 1e3
                ));
            }
        }
    }
    files.sort();
    println!("xtask: vite built the example into {}: {}", out.display(), files.join(", "));
    Ok((app, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_package_or_the_workspace() {
        let crate_toml = "[package]\nname = \"weft-web\"\nversion.workspace = true\n\n[lib]\nversion = \"9\"\n";
        assert_eq!(toml_version(crate_toml, "package").as_deref(), Some("workspace"));
        let workspace = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.1.0\"\nedition = \"2024\"\n";
        assert_eq!(toml_version(workspace, "workspace.package").as_deref(), Some("0.1.0"));
        assert_eq!(toml_version(workspace, "package"), None);
        assert_eq!(toml_version("[package]\nname = \"x\"\n[dependencies]\nversion = \"1\"\n", "package"), None);
    }

    #[test]
    fn finds_what_a_script_loads() {
        let js = "import { a } from './webgpu.js';\nimport x from 'lib';\n\
                  const w = new Worker(new URL('./weft-worker.js', import.meta.url), { type: 'module' });\n\
                  const m = await import('./pkg/weft_web.js');\n\
                  p = new URL('weft_web_bg.wasm', import.meta.url);\n\
                  u = new URL(given, base); v = new URL('https://x.test/', import.meta.url);";
        assert_eq!(
            relative_references(js),
            ["./webgpu.js", "./pkg/weft_web.js", "./weft-worker.js", "weft_web_bg.wasm"].map(String::from)
        );
    }
}
