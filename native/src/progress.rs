//! Model download and loading progress: a bar on a terminal, plain log lines (tracing) otherwise.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A callback for `EngineBuilder::on_progress` describing the upload of `model`.
pub fn loading(model: String) -> impl FnMut(usize, usize) + Send + 'static {
    let terminal = std::io::stderr().is_terminal();
    let mut bar: Option<ProgressBar> = None;
    let mut logged_quarter = None;
    move |done, total| {
        if terminal {
            let bar = bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(total as u64);
                let style = ProgressStyle::with_template("loading {msg} {bar:30} {pos}/{len} layers")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                bar.set_message(model.clone());
                bar
            });
            bar.set_position(done as u64);
            if done == total {
                bar.finish_and_clear();
            }
        } else {
            // A line per quarter: enough to follow a slow load in a log, not a flood.
            let quarter = done * 4 / total.max(1);
            if logged_quarter != Some(quarter) {
                logged_quarter = Some(quarter);
                tracing::info!("loading {model}: {done}/{total} layers on the GPU");
            }
        }
    }
}

/// A callback taking the bytes of `file` downloaded so far, of `total_bytes`.
pub fn downloading(file: String, total_bytes: u64) -> impl FnMut(u64) {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(total_bytes);
        let style = ProgressStyle::with_template(
            "downloading {msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(file.clone());
        bar
    });
    let mut logged_quarter = None;
    move |done| match &bar {
        Some(bar) => {
            bar.set_position(done);
            if done == total_bytes {
                bar.finish_and_clear();
            }
        }
        None => {
            let quarter = done * 4 / total_bytes.max(1);
            if logged_quarter != Some(quarter) {
                logged_quarter = Some(quarter);
                let mb = |bytes: u64| bytes as f64 / 1e6;
                tracing::info!("downloading {file}: {:.1} of {:.1} MB", mb(done), mb(total_bytes));
            }
        }
    }
}
