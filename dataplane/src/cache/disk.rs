//! Writing one disk entry during a fill, through io_uring (glommio DMA files, O_DIRECT).
//!
//! The file is created under `tmp/`, starts with a placeholder header block (same length as the
//! final one: only the checksum differs), receives the body as it streams from the origin, and is
//! closed (which syncs it). Then the final header is written over the placeholder and the file is
//! renamed to its entry path. Until that rename nothing can serve it; after a crash the index
//! rebuild deletes whatever is left in `tmp/`.
//!
//! Nothing here blocks the core: create, fallocate, writes, sync and rename are io_uring
//! operations; a missing directory is created on glommio's blocking thread, and temporary
//! files of failed fills are deleted by the store's [`Janitor`].

use super::janitor::Janitor;
use futures_lite::AsyncWriteExt;
use glommio::io::{DmaFile, DmaStreamWriter, DmaStreamWriterBuilder};
use std::io;
use std::path::{Path, PathBuf};
use switchyard_proto::cache::entry::{encode_header, BodyChecksum, EntryMeta};

/// Bytes buffered per DMA write; four in flight (write-behind).
const WRITE_BUFFER: usize = 1 << 20;

pub struct DiskFill {
    writer: Option<DmaStreamWriter>,
    temp: PathBuf,
    final_path: PathBuf,
    header_len: u64,
    checksum: BodyChecksum,
    written: u64,
    janitor: Janitor,
}

fn to_io(e: glommio::GlommioError<()>) -> io::Error {
    io::Error::from(e)
}

/// Creates `dirs` (and their parents) on glommio's blocking thread, off the core.
async fn create_dirs(dirs: Vec<PathBuf>) -> io::Result<()> {
    glommio::executor()
        .spawn_blocking(move || dirs.iter().try_for_each(std::fs::create_dir_all))
        .await
}

fn parent_of(path: &Path) -> Vec<PathBuf> {
    path.parent().map(Path::to_owned).into_iter().collect()
}

impl DiskFill {
    /// Creates the temporary file and writes the placeholder header for `meta`.
    pub async fn create(
        temp: PathBuf,
        final_path: PathBuf,
        meta: &EntryMeta,
        janitor: Janitor,
    ) -> io::Result<Self> {
        let file = match DmaFile::create(&temp).await.map_err(to_io) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // First fill (or the directory was removed): create `tmp/` and try once more.
                create_dirs(parent_of(&temp)).await?;
                DmaFile::create(&temp).await.map_err(to_io)?
            }
            other => other?,
        };
        let header = encode_header(meta);
        // Reserve the whole file up front: a full disk fails here, not half-way through.
        // (Filesystems without fallocate just skip the reservation.)
        if let Err(e) = file
            .pre_allocate(header.len() as u64 + meta.body_len, true)
            .await
        {
            let e = io::Error::from(e);
            if e.kind() == io::ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC) {
                let _ = file.close().await;
                janitor.remove(temp);
                return Err(e);
            }
        }
        let mut writer = DmaStreamWriterBuilder::new(file)
            .with_buffer_size(WRITE_BUFFER)
            .with_write_behind(4)
            .build();
        let mut fill = DiskFill {
            writer: None,
            temp,
            final_path,
            header_len: header.len() as u64,
            checksum: BodyChecksum::new(),
            written: 0,
            janitor,
        };
        if let Err(e) = writer.write_all(&header).await {
            drop(writer);
            fill.remove_temp();
            return Err(e);
        }
        fill.writer = Some(writer);
        Ok(fill)
    }

    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let writer = self
            .writer
            .as_mut()
            .ok_or_else(|| io::Error::other("fill already closed"))?;
        writer.write_all(bytes).await?;
        self.checksum.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Body bytes already on disk (readable through another descriptor of the file).
    pub fn flushed_body(&self) -> u64 {
        self.writer.as_ref().map_or(0, |w| {
            w.current_flushed_pos().saturating_sub(self.header_len)
        })
    }

    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    pub fn temp_path(&self) -> &std::path::Path {
        &self.temp
    }

    /// Seals the entry: final header, sync, rename. Returns the entry path and body offset.
    /// `meta.body_checksum` is set on the way.
    pub async fn finish(mut self, meta: &mut EntryMeta) -> io::Result<(PathBuf, u64)> {
        let result = self.seal(meta).await;
        match result {
            Ok(_) => self.temp = PathBuf::new(),
            Err(_) => self.remove_temp(),
        }
        result
    }

    async fn seal(&mut self, meta: &mut EntryMeta) -> io::Result<(PathBuf, u64)> {
        if let Some(mut writer) = self.writer.take() {
            writer.close().await?;
        }
        if self.written != meta.body_len {
            return Err(io::Error::other(format!(
                "body is {} bytes, expected {}",
                self.written, meta.body_len
            )));
        }
        meta.body_checksum = std::mem::take(&mut self.checksum).finish();
        let header = encode_header(meta);
        if header.len() as u64 != self.header_len {
            return Err(io::Error::other("entry header changed length"));
        }
        let file = glommio::io::OpenOptions::new()
            .write(true)
            .dma_open(&self.temp)
            .await
            .map_err(to_io)?;
        let mut buf = file.alloc_dma_buffer(header.len());
        buf.as_bytes_mut().copy_from_slice(&header);
        let wrote = file.write_at(buf, 0).await.map_err(to_io);
        let synced = match wrote {
            Ok(_) => file.fdatasync().await.map_err(to_io),
            Err(e) => Err(e),
        };
        let _ = file.close().await;
        synced?;
        match glommio::io::rename(&self.temp, &self.final_path)
            .await
            .map_err(to_io)
        {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The entry's fan-out directory does not exist yet.
                create_dirs(parent_of(&self.final_path)).await?;
                glommio::io::rename(&self.temp, &self.final_path)
                    .await
                    .map_err(to_io)?;
            }
            other => other?,
        }
        Ok((self.final_path.clone(), self.header_len))
    }

    /// Gives up the fill and deletes the temporary file. The writer is dropped, not closed:
    /// glommio 0.9 asserts in `close` after a write error (e.g. ENOSPC) and would take the core
    /// down; dropping cancels pending flushes instead.
    pub fn abort(mut self) {
        drop(self.writer.take());
        self.remove_temp();
    }

    fn remove_temp(&mut self) {
        // Once: after a successful rename (or a removal) the temporary name is gone.
        let temp = std::mem::take(&mut self.temp);
        if !temp.as_os_str().is_empty() {
            self.janitor.remove(temp);
        }
    }
}

impl Drop for DiskFill {
    /// A fill dropped half-way (its task cancelled) leaves no temporary file behind; after a
    /// successful rename the temporary path no longer exists and this is a no-op.
    fn drop(&mut self) {
        self.remove_temp();
    }
}
