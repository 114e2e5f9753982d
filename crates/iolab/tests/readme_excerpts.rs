//! The outputs pasted in README.md and every Markdown file under docs/ are what the binary
//! prints: every excerpt whose command is deterministic and self-contained is re-run, and its
//! lines (all but `...` elisions) must appear in the command's output, in order. A doc's
//! shell session that builds a results database step by step (docs/EXPERIMENTS.md: imports,
//! `reproduce`, `fit`, `run`, `compare`) is run in order on a fresh file. Excerpts that depend
//! on the host (`host`, `bench`) or on files not in the repository are not checked.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced code blocks of a Markdown file, each as its lines.
fn blocks(text: &str) -> Vec<Vec<&str>> {
    let mut out = Vec::new();
    let mut cur: Option<Vec<&str>> = None;
    for line in text.lines() {
        if line.starts_with("```") {
            match cur.take() {
                Some(b) => out.push(b),
                None => cur = Some(Vec::new()),
            }
        } else if let Some(b) = cur.as_mut() {
            b.push(line);
        }
    }
    out
}

/// The first pasted line of `want` (`...` elides) not found in order in `streams` (each
/// stream in its own order: a line may come from either), if any. A `wrote PATH: ...` line
/// matches whatever path the test wrote to (the test writes its files elsewhere).
fn first_missing<'a>(streams: &[Vec<&str>], want: &[&'a str]) -> Option<&'a str> {
    let after_path = |l: &str| {
        l.strip_prefix("wrote ")
            .and_then(|r| r.split_once(": "))
            .map(|(_, rest)| rest.to_owned())
    };
    let mut at = vec![0usize; streams.len()];
    for &w in want.iter().filter(|l| l.trim() != "...") {
        let matches = |g: &&str| *g == w || after_path(w).is_some_and(|p| after_path(g) == Some(p));
        let found = (0..streams.len())
            .find_map(|s| streams[s][at[s]..].iter().position(matches).map(|k| (s, k)));
        match found {
            Some((s, k)) => at[s] += k + 1,
            None => return Some(w),
        }
    }
    None
}

/// The experiments `iolab reproduce NAME` runs from the bundled files.
const BUNDLED: [&str; 6] = [
    "ipmmu-usb",
    "smmuv3-cmdq",
    "sba-vmerge",
    "pseries-ddw",
    "fands-iotlb",
    "protection",
];

/// One excerpt to check: the iolab arguments, the pasted lines and whether it runs in the
/// test's directory (where the block's `$ cat FILE` files were written) or the repository.
struct Excerpt<'a> {
    args: Vec<String>,
    lines: Vec<&'a str>,
    in_dir: bool,
}

/// The excerpts of a block: `$ iolab ...` segments with the lines after them, or a block of
/// output alone whose first line says which command printed it.
fn excerpts<'a>(block: &[&'a str], dir: &Path) -> Vec<Excerpt<'a>> {
    let mut out = Vec::new();
    if !block.iter().any(|l| l.starts_with("$ ")) {
        let first = block.first().copied().unwrap_or("");
        let args: Option<Vec<&str>> = if let Some(rest) = first.strip_prefix("== ") {
            let name = rest.split(':').next().unwrap_or("");
            // A bundled experiment's report (the vm-disk one needs its import first; a soak
            // report is not a command's output on its own).
            BUNDLED
                .contains(&name)
                .then(|| vec!["--no-db", "reproduce", name])
        } else if first.starts_with("fidelity goals met") {
            Some(vec!["--no-db", "reproduce"])
        } else if first.starts_with("cell: throughput and reach") {
            Some(vec!["--no-db", "reproduce", "protection"])
        } else {
            None
        };
        if let Some(args) = args {
            out.push(Excerpt {
                args: args.into_iter().map(String::from).collect(),
                lines: block.to_vec(),
                in_dir: false,
            });
        }
        return out;
    }
    let mut written: Vec<String> = Vec::new();
    let mut i = 0;
    while i < block.len() {
        let end = (i + 1..block.len())
            .find(|&j| block[j].starts_with("$ "))
            .unwrap_or(block.len());
        // `$ cat FILE` shows a file the next commands use: write it where they run.
        if let Some(name) = block[i].strip_prefix("$ cat ") {
            std::fs::write(dir.join(name), block[i + 1..end].join("\n") + "\n").unwrap();
            written.push(name.to_owned());
            i = end;
            continue;
        }
        let Some(cmd) = block[i].strip_prefix("$ iolab ") else {
            i += 1;
            continue;
        };
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let uses_written = words.iter().any(|w| written.iter().any(|f| f == w));
        let deterministic = matches!(words.first(), Some(&"run") | Some(&"trace"))
            && words.contains(&"--example")
            || words.first() == Some(&"reproduce") && !words.contains(&"--emit-scenarios")
            || uses_written && words.contains(&"--no-db");
        if deterministic {
            // `trace` uses no results database; the others are kept from writing one.
            let mut args: Vec<String> = if words.first() == Some(&"trace") {
                Vec::new()
            } else {
                vec!["--no-db".to_owned()]
            };
            for w in &words {
                // Output files go to the test's directory.
                if *w == "--no-db" {
                    continue;
                } else if w.ends_with(".json") || w.ends_with(".html") {
                    args.push(dir.join(w).to_string_lossy().into_owned());
                } else {
                    args.push((*w).to_owned());
                }
            }
            out.push(Excerpt {
                args,
                lines: block[i + 1..end].to_vec(),
                in_dir: uses_written,
            });
        }
        i = end;
    }
    out
}

/// Checks every excerpt of `file`; returns how many were checked.
fn check(file: &str) -> usize {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "iolab-excerpts-{}-{}",
        file.replace('/', "-"),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for block in blocks(&text) {
        for ex in excerpts(&block, &dir) {
            let out = Command::new(env!("CARGO_BIN_EXE_iolab"))
                .args(&ex.args)
                .current_dir(if ex.in_dir { dir.clone() } else { repo() })
                .output()
                .unwrap();
            // A terminal interleaves the two streams; each keeps its own order.
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            let streams = [stdout.lines().collect(), stderr.lines().collect()];
            if let Some(want) = first_missing(&streams, &ex.lines) {
                failures.push(format!(
                    "{file}: `iolab {}` no longer prints, in order:\n  {want}",
                    ex.args.join(" ")
                ));
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "pasted outputs drifted from the binary (re-run and re-paste them):\n{}",
        failures.join("\n")
    );
    checked
}

#[test]
fn readme_excerpts_are_what_the_binary_prints() {
    // The reproduce excerpts, the fidelity summary, the protection table, the fio,
    // dma_map_benchmark and VT-d runs and the trace lines.
    assert!(check("README.md") >= 8);
}

#[test]
fn security_md_excerpts_are_what_the_binary_prints() {
    assert!(check("docs/SECURITY.md") >= 1);
}

#[test]
fn scale_md_excerpts_are_what_the_binary_prints() {
    assert!(check("docs/SCALE.md") >= 1);
}

/// Every other Markdown file under docs/ (docs/model/ included), checked as the three above;
/// returns how many excerpts were checked.
fn check_other_docs() -> usize {
    let mut n = 0;
    for dir in ["docs", "docs/model"] {
        let mut names: Vec<String> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".md"))
            .collect();
        names.sort();
        for name in names {
            if dir == "docs" && ["SECURITY.md", "SCALE.md"].contains(&name.as_str()) {
                continue;
            }
            n += check(&format!("{dir}/{name}"));
        }
    }
    n
}

#[test]
fn every_other_doc_s_excerpts_are_what_the_binary_prints() {
    // docs/*.md and docs/model/*.md: whatever excerpt is deterministic and self-contained.
    let n = check_other_docs();
    eprintln!("{n} excerpts checked in the other docs");
}

/// A doc's shell session on `mine.db`, run in order on a fresh results file: each fenced
/// block's commands (`iolab ...` or `$ ...` lines; `# ...` comments dropped) that use the
/// session's files (`mine.db`, `fitted.toml`, `strict.toml`, kept in a temporary directory)
/// run through `sh` in the repository with the binary for `iolab`; the lines after a `$`
/// command, or a following block without commands, must appear in that command's output in
/// order (`...` elides; a block of bare `iolab` lines has its output in the next block).
/// A block that starts with an import into `mine.db` starts a new
/// results file. Other commands are left to [`check`]. Returns how many outputs were checked.
fn check_session(file: &str) -> usize {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "iolab-session-{}-{}",
        std::process::id(),
        file.replace('/', "-")
    ));
    let bin = env!("CARGO_BIN_EXE_iolab");
    let mut session = 0;
    let mut last_output: Option<(String, String)> = None;
    let mut failures = Vec::new();
    let mut checked = 0;
    let expect = |cmd: &str, output: &str, want: &[&str], failures: &mut Vec<String>| {
        if let Some(w) = first_missing(&[output.lines().collect()], want) {
            failures.push(format!(
                "{file}: `{cmd}` no longer prints, in order:\n  {w}"
            ));
        }
    };
    for block in blocks(&text) {
        let is_command = |l: &str| l.starts_with("iolab ") || l.starts_with("$ ");
        if !block.iter().any(|l| is_command(l)) {
            if let Some((cmd, out)) = last_output.take() {
                if !block.is_empty() && !block[0].starts_with('[') && !block[0].contains(" = ") {
                    expect(&cmd, &out, &block, &mut failures);
                    checked += 1;
                }
            }
            continue;
        }
        let first = block.iter().find(|l| is_command(l)).unwrap();
        if first.contains("--db mine.db import ") {
            session += 1;
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
        }
        if session == 0 {
            continue;
        }
        let mut i = 0;
        while i < block.len() {
            let line = block[i];
            i += 1;
            if !is_command(line) {
                continue;
            }
            let raw = line.strip_prefix("$ ").unwrap_or(line);
            let cmd = raw.split("  #").next().unwrap().trim().to_owned();
            let in_session = ["mine.db", "fitted.toml", "strict.toml"]
                .iter()
                .any(|f| cmd.split_whitespace().any(|w| w == *f));
            if !in_session {
                last_output = None;
                while i < block.len() && !is_command(block[i]) {
                    i += 1;
                }
                continue;
            }
            let mut sh = cmd.clone();
            if let Some(rest) = sh.strip_prefix("iolab ") {
                sh = format!("{bin} {rest}");
            }
            for name in ["mine.db", "fitted.toml", "strict.toml"] {
                sh = sh.replace(
                    &format!(" {name}"),
                    &format!(" {}", dir.join(name).display()),
                );
            }
            let out = Command::new("sh")
                .arg("-c")
                .arg(&sh)
                .current_dir(repo())
                .env("NO_COLOR", "1")
                .output()
                .unwrap();
            let output = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() {
                failures.push(format!("{file}: `{cmd}` failed:\n{output}"));
            }
            // The lines pasted after a `$` command are its output.
            let mut want = Vec::new();
            while i < block.len() && !is_command(block[i]) {
                want.push(block[i]);
                i += 1;
            }
            if line.starts_with("$ ") {
                if !want.is_empty() {
                    expect(&cmd, &output, &want, &mut failures);
                    checked += 1;
                }
                last_output = None;
            } else {
                // A block of bare commands: its output is pasted in the next block.
                last_output = Some((cmd, output));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "pasted outputs drifted from the binary (re-run and re-paste them):\n{}",
        failures.join("\n")
    );
    checked
}

#[test]
fn readme_session_is_what_the_binary_prints() {
    // The import, the worked example's report and `iolab fit`.
    assert!(check_session("README.md") >= 3);
}

#[test]
fn experiments_md_sessions_are_what_the_binary_prints() {
    // The worked example's report, `iolab fit`'s output and the compare runs after it.
    assert!(check_session("docs/EXPERIMENTS.md") >= 4);
}
