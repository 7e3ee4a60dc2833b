//! Artifact freshness: recomputes the `sourceHash` that `abi/build` writes into every
//! artifact (algorithm in `abi/README.md`) from the sources in `abi/src`, the compiler
//! version and the exact settings JSON recorded in `abi/out/build-info.json`.
//!
//! A differing hash means a source changed and `abi/build` was not run. (`abi/build
//! --check` goes further and recompiles; this check needs no Node.js.)

use crate::{AbiError, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn artifact_error(path: &Path, reason: &str) -> AbiError {
    AbiError::Artifact {
        path: path.display().to_string(),
        reason: reason.to_owned(),
    }
}

fn collect(dir: &Path, root: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|_| artifact_error(dir, "cannot be listed"))?;
    for entry in entries {
        let path = entry
            .map_err(|_| artifact_error(dir, "cannot be listed"))?
            .path();
        if path.is_dir() {
            collect(&path, root, out)?;
        } else if path.extension().is_some_and(|e| e == "sol") {
            let rel = path
                .strip_prefix(root)
                .map_err(|_| artifact_error(&path, "outside abi/src"))?;
            let parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
}

/// The lowercase hex SHA-256 `sourceHash` of `abi_dir/src` for the given compiler
/// version and settings JSON string.
///
/// # Errors
/// [`AbiError::Artifact`] when a source cannot be read.
pub fn source_hash(abi_dir: &Path, compiler_version: &str, settings_json: &str) -> Result<String> {
    let src = abi_dir.join("src");
    let mut files = Vec::new();
    collect(&src, &src, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for rel in &files {
        let path: PathBuf = src.join(rel);
        let bytes = std::fs::read(&path).map_err(|_| artifact_error(&path, "cannot be read"))?;
        h.update(rel.as_bytes());
        h.update([0u8]);
        h.update(&bytes);
        h.update([0u8]);
    }
    h.update(compiler_version.as_bytes());
    h.update([0u8]);
    h.update(settings_json.as_bytes());
    Ok(hex::encode(h.finalize()))
}

/// Artifacts whose `sourceHash` differs from the current sources, by file name
/// (`build-info.json` included). Empty when everything is fresh.
///
/// # Errors
/// [`AbiError::Artifact`] when `abi/out/build-info.json` or an artifact is unreadable.
pub fn stale_artifacts(abi_dir: &Path) -> Result<Vec<String>> {
    let info_path = abi_dir.join("out/build-info.json");
    let info: serde_json::Value = std::fs::read_to_string(&info_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| artifact_error(&info_path, "missing or not JSON (run abi/build)"))?;
    let field = |name: &str| {
        info.get(name)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .ok_or_else(|| artifact_error(&info_path, "lacks compilerVersion/settingsJson"))
    };
    let expected = source_hash(abi_dir, &field("compilerVersion")?, &field("settingsJson")?)?;
    let mut stale = Vec::new();
    if info.get("sourceHash").and_then(|v| v.as_str()) != Some(expected.as_str()) {
        stale.push("build-info.json".to_owned());
    }
    let out = abi_dir.join("out");
    let entries = std::fs::read_dir(&out).map_err(|_| artifact_error(&out, "cannot be listed"))?;
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && !p.ends_with("build-info.json"))
        .collect();
    names.sort();
    for path in names {
        let json: serde_json::Value = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .ok_or_else(|| artifact_error(&path, "not JSON"))?;
        if json.get("sourceHash").and_then(|v| v.as_str()) != Some(expected.as_str()) {
            stale.push(
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn abi_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../abi")
    }

    /// Fails when a file in `abi/src` changed and `abi/build` was not re-run.
    #[test]
    fn committed_artifacts_match_sources() {
        let stale = stale_artifacts(&abi_dir()).unwrap();
        assert!(
            stale.is_empty(),
            "stale artifacts (run abi/build): {stale:?}"
        );
    }

    /// The check notices an edited source (on a copy of abi/).
    #[test]
    fn edited_source_is_detected() {
        let tmp = tempfile::tempdir().unwrap();
        for sub in ["src", "src/interfaces", "src/test", "out"] {
            std::fs::create_dir_all(tmp.path().join(sub)).unwrap();
        }
        let copy = |rel: &str| {
            std::fs::copy(abi_dir().join(rel), tmp.path().join(rel)).unwrap();
        };
        for dir in ["src", "src/interfaces", "src/test", "out"] {
            for e in std::fs::read_dir(abi_dir().join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.is_file() {
                    copy(&format!(
                        "{dir}/{}",
                        p.file_name().unwrap().to_string_lossy()
                    ));
                }
            }
        }
        assert!(stale_artifacts(tmp.path()).unwrap().is_empty());
        let f = tmp.path().join("src/Directory.sol");
        let mut text = std::fs::read_to_string(&f).unwrap();
        text.push_str("\n// edited\n");
        std::fs::write(&f, text).unwrap();
        let stale = stale_artifacts(tmp.path()).unwrap();
        assert!(stale.contains(&"Directory.json".to_owned()), "{stale:?}");
        assert!(stale.contains(&"build-info.json".to_owned()));
    }
}
