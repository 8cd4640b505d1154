//! Deletes cache files on a thread of its own, so no data-plane core ever blocks in `unlink(2)`
//! (an eviction, a replaced or damaged entry, an aborted fill). Callers hand over a path and go
//! on; deletions happen in order. Paths handed over are never reused (entry and temporary file
//! names are unique per fill), so a late deletion can never hit a newer file.

use std::path::PathBuf;
use std::sync::mpsc;

enum Job {
    Remove(PathBuf),
    /// Answers once every earlier job is done.
    Flush(mpsc::Sender<()>),
}

/// Cloned freely: every clone feeds the same thread.
#[derive(Clone)]
pub struct Janitor {
    jobs: Option<mpsc::Sender<Job>>,
}

fn remove(path: &std::path::Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "cannot delete cache file");
        }
    }
}

impl Janitor {
    /// Starts the deleting thread (it ends when the janitor is dropped). Without a thread,
    /// deletions happen inline.
    pub fn start() -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("cache-janitor".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Remove(path) => remove(&path),
                        Job::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        match spawned {
            Ok(_) => Janitor { jobs: Some(tx) },
            Err(e) => {
                tracing::warn!(error = %e, "no cache janitor thread; deleting files inline");
                Janitor { jobs: None }
            }
        }
    }

    /// Deletes `path` soon, off the caller's thread.
    pub fn remove(&self, path: PathBuf) {
        match &self.jobs {
            Some(jobs) => {
                if let Err(mpsc::SendError(Job::Remove(path))) = jobs.send(Job::Remove(path)) {
                    remove(&path);
                }
            }
            None => remove(&path),
        }
    }

    /// Waits until every deletion handed over so far is done (control plane and tests only).
    pub fn flush(&self) {
        if let Some(jobs) = &self.jobs {
            let (tx, rx) = mpsc::channel();
            if jobs.send(Job::Flush(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_in_the_background_and_flushes() {
        let dir = std::env::temp_dir().join(format!("sy-janitor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let janitor = Janitor::start();
        let files: Vec<PathBuf> = (0..20).map(|i| dir.join(format!("{i}"))).collect();
        for f in &files {
            std::fs::write(f, b"x").expect("write");
            janitor.remove(f.clone());
        }
        janitor.remove(dir.join("never-existed"));
        janitor.flush();
        assert!(files.iter().all(|f| !f.exists()));
        let _ = std::fs::remove_dir(&dir);
    }
}
