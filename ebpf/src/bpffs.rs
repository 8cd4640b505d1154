//! The bpf file system that pinned maps and links live on: checking for it and mounting it.

use std::path::Path;
use std::process::Command;

use crate::Error;

/// The file-system type of the mount `path` lies on, from a `/proc/self/mountinfo` text: the
/// longest mount point that is a prefix of `path` wins.
pub fn fs_type_of(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mount_point), Some(fs_type)) = (fields.get(4), fields.get(sep + 1)) else {
            continue;
        };
        let mount_point = unescape_mountinfo(mount_point);
        if path.starts_with(&mount_point)
            && best
                .as_ref()
                .is_none_or(|(len, _)| mount_point.len() >= *len)
        {
            best = Some((mount_point.len(), (*fs_type).to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// A path field of `/proc/self/mountinfo` as the path it is: mountinfo writes space, tab, newline
/// and backslash as `\` and three octal digits (`\040`).
pub fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `dir` is on a bpf file system.
pub fn is_bpffs(dir: &Path) -> bool {
    let Ok(canonical) = dir.canonicalize() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| fs_type_of(&info, &canonical))
        .is_some_and(|t| t == "bpf")
}

/// Creates `dir` and mounts a bpf file system on it unless it is on one already. Returns whether
/// it mounted (the caller records that, so cleanup unmounts it again).
pub fn ensure_bpffs(dir: &Path) -> Result<bool, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("create {}", dir.display()), e))?;
    if is_bpffs(dir) {
        return Ok(false);
    }
    let status = Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(dir)
        .status()
        .map_err(|e| Error::Io("run mount".into(), e))?;
    if !status.success() || !is_bpffs(dir) {
        return Err(Error::Bpffs(dir.to_path_buf()));
    }
    Ok(true)
}

/// Unmounts a bpf file system mounted by [`ensure_bpffs`]; pins on it are dropped with it.
pub fn unmount_bpffs(dir: &Path) -> Result<(), Error> {
    if !is_bpffs(dir) {
        return Ok(());
    }
    let status = Command::new("umount")
        .arg(dir)
        .status()
        .map_err(|e| Error::Io("run umount".into(), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::Bpffs(dir.to_path_buf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / rw,relatime - ext4 /dev/root rw
30 22 0:26 / /sys/fs/bpf rw,nosuid - bpf bpf rw,mode=700
31 22 0:27 / /tmp rw - tmpfs tmpfs rw
32 31 0:28 / /tmp/pins\\040x rw - bpf bpf rw
";

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        // a backslash without three octal digits stays as it is
        assert_eq!(unescape_mountinfo("/x\\04"), "/x\\04");
        assert_eq!(unescape_mountinfo("/x\\999"), "/x\\999");
    }

    #[test]
    fn longest_mount_point_decides() {
        assert_eq!(
            fs_type_of(INFO, Path::new("/sys/fs/bpf/switchyard")).as_deref(),
            Some("bpf")
        );
        assert_eq!(
            fs_type_of(INFO, Path::new("/tmp/other")).as_deref(),
            Some("tmpfs")
        );
        assert_eq!(
            fs_type_of(INFO, Path::new("/tmp/pins x/a")).as_deref(),
            Some("bpf")
        );
        assert_eq!(
            fs_type_of(INFO, Path::new("/home")).as_deref(),
            Some("ext4")
        );
        assert_eq!(fs_type_of("garbage line\n", Path::new("/")), None);
    }
}
