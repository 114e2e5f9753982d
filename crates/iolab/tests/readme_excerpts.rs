//! The outputs pasted in README.md, docs/SECURITY.md and docs/SCALE.md are what the binary prints: every
//! excerpt whose command is deterministic and self-contained is re-run, and its lines (all
//! but `...` elisions) must appear in the command's output, in order. Excerpts that depend on
//! a results database built by earlier steps (`runs list`, `compare`, `report`), on the host
//! (`host`, `bench`) or on files not in the repository are not checked here.

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
            let streams: [Vec<&str>; 2] = [stdout.lines().collect(), stderr.lines().collect()];
            let mut at = [0usize; 2];
            for want in ex.lines.iter().filter(|l| l.trim() != "...") {
                // Output files are named as pasted; the test wrote them elsewhere.
                let after_path = |l: &str| {
                    l.strip_prefix("wrote ")
                        .and_then(|r| r.split_once(": "))
                        .map(|(_, rest)| rest.to_owned())
                };
                let matches = |g: &&str| {
                    g == want || after_path(want).is_some_and(|w| after_path(g) == Some(w))
                };
                let found = (0..2)
                    .find_map(|s| streams[s][at[s]..].iter().position(matches).map(|k| (s, k)));
                match found {
                    Some((s, k)) => at[s] += k + 1,
                    None => {
                        failures.push(format!(
                            "{file}: `iolab {}` no longer prints, in order:\n  {want}",
                            ex.args.join(" ")
                        ));
                        break;
                    }
                }
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
