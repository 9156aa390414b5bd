//! The compiled kernels kept on disk. A GPU's kernels are built from the CUDA source at run
//! time. Built as PTX, that took 62.5 s in the first process of a fresh H200 machine (NVRTC,
//! then the driver translating 12.7 MB of PTX to machine code), again wherever the driver's own
//! cache was empty — a fresh container, a new driver — and NVRTC's 1.1 s at every start. Now
//! NVRTC builds the machine code itself (a CUBIN for the device's architecture: 19.7 s on a fresh
//! machine, 1.1 s warm; RESULTS "Kernels cached on disk") and it is stored under the cache
//! directory, named by a digest of everything that decides it (the source, the options, NVRTC's
//! version), so a later start loads it in about 20 ms and a changed source or toolkit builds
//! afresh.
//!
//! A file is `nectar-kernels 1 <sha256 of the image>\n` then the image: a truncated or altered
//! file fails the digest and is built over. Written to a temporary name and renamed, so a
//! reader never sees half a file; any I/O error only costs the build (the cache is an
//! optimisation). The [`KEEP`] most recently used builds stay; older ones are removed.
//! Directory: `NECTAR_CACHE_DIR` (empty: no cache), else `$XDG_CACHE_HOME/nectar`, else
//! `~/.cache/nectar`.
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"nectar-kernels 1 ";

/// Where compiled kernels are kept (`None`: caching is off or there is no home).
pub(crate) fn dir() -> Option<PathBuf> {
    let var = std::env::var_os;
    dir_from(var("NECTAR_CACHE_DIR"), var("XDG_CACHE_HOME"), var("HOME"))
}

fn dir_from(
    nectar: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    match nectar {
        Some(d) => set(Some(d)),
        None => set(xdg)
            .or_else(|| set(home).map(|h| h.join(".cache")))
            .map(|d| d.join("nectar")),
    }
}

/// The cache file for kernels built from `parts` (source, options, compiler version).
pub(crate) fn path(dir: &Path, parts: &[&str]) -> PathBuf {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    dir.join(format!("kernels-{}.bin", hex(&h.finalize()[..16])))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The image stored at `path`, if the file is whole (its digest matches).
pub(crate) fn load(path: &Path) -> Option<Vec<u8>> {
    let file = std::fs::read(path).ok()?;
    let rest = file.strip_prefix(MAGIC)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let (digest, image) = (&rest[..nl], &rest[nl + 1..]);
    let whole = digest == hex(&Sha256::digest(image)).as_bytes();
    if whole {
        // Used now: the pruning in `store` keeps the most recently used builds.
        let _ = std::fs::File::options()
            .append(true)
            .open(path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    }
    whole.then(|| image.to_vec())
}

/// Builds kept per cache directory: every kernel source a user ran (each upgrade of Nectar, each
/// architecture of a machine with several GPUs) adds one of about 5 MB; the least recently
/// used beyond this many are removed when a new one is stored.
const KEEP: usize = 8;

/// Stores `image` at `path` (best effort: an error leaves no file behind but its temporary
/// one's removal, and the next start builds again).
pub(crate) fn store(path: &Path, image: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut body = MAGIC.to_vec();
    body.extend_from_slice(hex(&Sha256::digest(image)).as_bytes());
    body.push(b'\n');
    body.extend_from_slice(image);
    let written = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    prune(dir, KEEP);
    Ok(())
}

/// Removes all but the `keep` most recently used builds (`kernels-*.bin`) in `dir`; best effort.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut builds: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("kernels-") && name.ends_with(".bin")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    builds.sort_by_key(|b| std::cmp::Reverse(b.0));
    for (_, p) in builds.into_iter().skip(keep) {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_image_loads_back_and_a_damaged_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), &["source", "options", "13.0"]);
        assert_eq!(load(&p), None, "nothing stored yet");
        let image: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        store(&p, &image).unwrap();
        assert_eq!(load(&p).as_deref(), Some(&image[..]));
        // Truncated, or changed after writing: built over, never loaded.
        let file = std::fs::read(&p).unwrap();
        std::fs::write(&p, &file[..file.len() - 3]).unwrap();
        assert_eq!(load(&p), None);
        let mut flipped = file.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&p, &flipped).unwrap();
        assert_eq!(load(&p), None);
        std::fs::write(&p, "garbage").unwrap();
        assert_eq!(load(&p), None);
        // No temporary file is left behind.
        store(&p, b"x").unwrap();
        assert_eq!(load(&p).as_deref(), Some(&b"x"[..]));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn only_the_most_recently_used_builds_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let at = |i: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
        let first = path(dir.path(), &["first"]);
        store(&first, b"image").unwrap();
        // KEEP + 2 older builds (copies of a whole one, so they load).
        let paths: Vec<PathBuf> = (0..KEEP as u64 + 2)
            .map(|i| {
                let p = path(dir.path(), &[&i.to_string()]);
                std::fs::copy(&first, &p).unwrap();
                let f = std::fs::File::options().append(true).open(&p).unwrap();
                f.set_modified(at(i)).unwrap();
                p
            })
            .collect();
        // The oldest build is used again: it becomes the newest.
        assert!(load(&paths[0]).is_some());
        std::fs::remove_file(&first).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a build").unwrap();
        store(&path(dir.path(), &["new"]), b"image").unwrap();
        let kept: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        // KEEP builds remain: the new one, the one just loaded, and the newest others.
        let mut want = vec![false; KEEP + 2];
        want[0] = true;
        for w in want.iter_mut().skip(4) {
            *w = true;
        }
        assert_eq!(kept, want);
        assert!(
            dir.path().join("notes.txt").exists(),
            "other files are left alone"
        );
    }

    #[test]
    fn the_directory_follows_the_environment() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            dir_from(s("/n"), s("/x"), s("/h")),
            Some(PathBuf::from("/n"))
        );
        assert_eq!(dir_from(s(""), s("/x"), s("/h")), None, "empty: no cache");
        assert_eq!(
            dir_from(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/nectar"))
        );
        assert_eq!(
            dir_from(None, s(""), s("/h")),
            Some(PathBuf::from("/h/.cache/nectar"))
        );
        assert_eq!(dir_from(None, None, None), None);
    }

    #[test]
    fn every_input_of_the_compile_names_its_own_file() {
        let d = Path::new("/c");
        let a = path(d, &["src", "opts", "13.0"]);
        assert_ne!(a, path(d, &["src2", "opts", "13.0"]));
        assert_ne!(a, path(d, &["src", "opts2", "13.0"]));
        assert_ne!(a, path(d, &["src", "opts", "13.1"]));
        // Parts are delimited: moving text from one part to the next is another key.
        assert_ne!(path(d, &["ab", "c"]), path(d, &["a", "bc"]));
        assert_eq!(a, path(d, &["src", "opts", "13.0"]));
    }
}
