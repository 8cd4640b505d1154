//! Obtaining source subtitles for a video URL: existing caption tracks (a direct `.vtt`/`.srt`
//! URL, `<track>` elements of an HTML page, or a video site's tracks through `yt-dlp -J`),
//! unless `force_whisper`; otherwise the media (a direct media URL, a page's `<video>`/`<audio>`
//! source, or `yt-dlp` download), transcoded to 16 kHz mono MP3 by ffmpeg when present, and
//! transcribed. Unreachable or missing video → VIDEO_NOT_FOUND; transcription problems →
//! TRANSCRIPTION_FAILED.

use std::path::{Path, PathBuf};

use futures::StreamExt as _;
use serde_json::Value;
use switchyard_config::subtitles::SubtitlesConfig;
use url::Url;

use crate::error::{Error, ErrorCode};
use crate::fetch_guard::{self, FetchPolicy};
use crate::formats::{self, Cue};
use crate::html;
use crate::languages;
use crate::media::{self, Container};
use crate::providers::{self, TranscriptionTarget};
use crate::retry::RetryPolicy;
use crate::tools::{self, Tools};

/// Source subtitles and where they came from.
#[derive(Debug, Clone)]
pub struct Source {
    pub cues: Vec<Cue>,
    /// Language as the source reported it (`srclang`, yt-dlp's key, Whisper's answer).
    pub language: Option<String>,
    pub transcribed: bool,
}

/// Stages reported while obtaining the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Fetching,
    Transcribing,
}

/// What the service needs to obtain a source.
pub struct Ctx<'a> {
    /// For configured endpoints (the server's transcription backend).
    pub http: &'a reqwest::Client,
    /// For caller-named URLs (pages, tracks, media, tier 1's `api_url`): guarded.
    pub fetch_http: &'a reqwest::Client,
    pub policy: &'a FetchPolicy,
    /// `--proxy` for yt-dlp (the guard proxy), when the guard is on.
    pub ytdlp_proxy: Option<String>,
    pub cfg: &'a SubtitlesConfig,
    pub tools: &'a Tools,
    pub retry: RetryPolicy,
    /// Directory for temporary media files (inside the data directory).
    pub media_dir: &'a Path,
}

/// Where the media is.
#[derive(Debug, Clone)]
enum Media {
    Url(Url),
    YtDlp(String),
}

fn not_found(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::VideoNotFound, msg)
}

fn transcription_failed(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::TranscriptionFailed, msg)
}

fn refused(r: &fetch_guard::Refused) -> Error {
    Error::new(ErrorCode::InvalidUrl, format!("not fetched: {r}"))
}

/// GETs a caller-named URL through the guard: the IP-literal check here, names in the
/// resolver, redirects in the client's policy. A refusal is INVALID_URL; other failures
/// VIDEO_NOT_FOUND.
async fn guarded_get(ctx: &Ctx<'_>, url: &Url) -> Result<reqwest::Response, Error> {
    fetch_guard::check_url_static(ctx.policy, url).map_err(|r| refused(&r))?;
    ctx.fetch_http
        .get(url.clone())
        .timeout(ctx.cfg.limits.fetch_timeout.0)
        .send()
        .await
        .map_err(|e| {
            if let Some(r) = fetch_guard::refused_in(&e) {
                return refused(r);
            }
            let why = if e.is_timeout() {
                "timed out"
            } else if e.is_redirect() {
                "too many redirects"
            } else {
                "cannot connect"
            };
            not_found(format!(
                "video not accessible: {why} ({})",
                url_for_log(url)
            ))
        })
}

/// Whether the host is (a subdomain of) one of the configured video sites.
pub fn is_video_site(url: &Url, sites: &[String]) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.to_ascii_lowercase();
    sites.iter().any(|s| {
        let s = s.trim().to_ascii_lowercase();
        !s.is_empty() && (host == s || host.ends_with(&format!(".{s}")))
    })
}

fn is_media_type(content_type: &str, url: &Url) -> bool {
    let ct = content_type.to_ascii_lowercase();
    if ct.starts_with("audio/") || ct.starts_with("video/") || ct == "application/ogg" {
        return true;
    }
    let path = url.path().to_ascii_lowercase();
    let media_ext = [
        ".mp3", ".mp4", ".m4a", ".wav", ".webm", ".ogg", ".oga", ".opus", ".flac", ".mkv", ".mov",
        ".aac", ".mpga", ".mpeg",
    ];
    (ct.is_empty() || ct.starts_with("application/octet-stream"))
        && media_ext.iter().any(|e| path.ends_with(e))
}

/// Picks a subtitle from yt-dlp's `-J` info: the wanted language, else the video's own
/// language, else the only or the first manual track; automatic captions only in the wanted
/// or the video's own language (others are machine translations). Formats we parse: vtt, srt.
pub fn choose_ytdlp_subtitle(info: &Value, wanted: Option<&str>) -> Option<(String, String)> {
    let own = info["language"].as_str();
    let pick = |tracks: &serde_json::Map<String, Value>, lang: &str| -> Option<String> {
        let entries = tracks.get(lang)?.as_array()?;
        ["vtt", "srt"].iter().find_map(|ext| {
            entries
                .iter()
                .find(|e| e["ext"].as_str() == Some(ext))
                .and_then(|e| e["url"].as_str())
                .map(str::to_string)
        })
    };
    let matching = |tracks: &serde_json::Map<String, Value>, want: &str| {
        tracks
            .keys()
            .filter(|k| {
                languages::same_language(k, want)
                    || k.strip_suffix("-orig")
                        .is_some_and(|b| languages::same_language(b, want))
            })
            .find_map(|k| pick(tracks, k).map(|u| (k.clone(), u)))
    };
    let manual = info["subtitles"].as_object();
    let auto = info["automatic_captions"].as_object();
    for want in [wanted, own].into_iter().flatten() {
        if let Some(hit) = manual.and_then(|m| matching(m, want)) {
            return Some(hit);
        }
        if let Some(hit) = auto.and_then(|m| matching(m, want)) {
            return Some(hit);
        }
    }
    let manual = manual?;
    manual
        .keys()
        .find_map(|k| pick(manual, k).map(|u| (k.clone(), u)))
}

/// A fetched page or subtitle file.
struct Fetched {
    url: Url,
    content_type: String,
    body: Option<Vec<u8>>,
}

/// GETs `url`; media responses are not read (only classified).
async fn fetch_page(ctx: &Ctx<'_>, url: &Url) -> Result<Fetched, Error> {
    let resp = guarded_get(ctx, url).await?;
    if !resp.status().is_success() {
        return Err(not_found(format!(
            "video not accessible: {} answered HTTP {}",
            url_for_log(url),
            resp.status().as_u16()
        )));
    }
    let final_url = resp.url().clone();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if is_media_type(&content_type, &final_url) {
        return Ok(Fetched {
            url: final_url,
            content_type,
            body: None,
        });
    }
    let max = ctx.cfg.limits.max_page_size.0;
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| not_found("video not accessible: the download broke off"))?;
        if (body.len() + chunk.len()) as u64 > max {
            return Err(not_found(format!(
                "{} is larger than limits.max_page_size",
                url_for_log(url)
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Fetched {
        url: final_url,
        content_type,
        body: Some(body),
    })
}

/// Scheme, host and path only (queries may carry tokens).
fn url_for_log(url: &Url) -> String {
    format!(
        "{}://{}{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.path()
    )
}

async fn fetch_captions(ctx: &Ctx<'_>, url: &Url) -> Result<Vec<Cue>, Error> {
    let f = fetch_page(ctx, url).await?;
    let text = f
        .body
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    formats::parse_any(&text)
        .ok_or_else(|| not_found(format!("{} is not SRT or WebVTT", url_for_log(url))))
}

/// The guard's check of a URL handed to yt-dlp, for a clear INVALID_URL; yt-dlp's own
/// connections (this URL, redirects, what it extracts) go through the guard proxy.
async fn check_for_ytdlp(ctx: &Ctx<'_>, url: &str) -> Result<(), Error> {
    let parsed =
        Url::parse(url).map_err(|_| Error::new(ErrorCode::InvalidUrl, "invalid video URL"))?;
    fetch_guard::check_url(ctx.policy, &parsed)
        .await
        .map_err(|r| refused(&r))
}

/// yt-dlp's info JSON for a page.
async fn ytdlp_info(ctx: &Ctx<'_>, url: &str) -> Result<Value, Error> {
    let Some(tool) = &ctx.tools.yt_dlp else {
        return Err(not_found("yt-dlp is not installed"));
    };
    check_for_ytdlp(ctx, url).await?;
    let mut args = vec!["-J", "--no-playlist", "--no-warnings"];
    if let Some(p) = &ctx.ytdlp_proxy {
        args.extend(["--proxy", p.as_str()]);
    }
    args.push(url);
    let out = tools::run(&tool.path, &args, ctx.cfg.tools.timeout.0)
        .await
        .map_err(|e| not_found(format!("video not accessible (yt-dlp: {e})")))?;
    serde_json::from_slice(&out).map_err(|_| not_found("yt-dlp gave no video information"))
}

/// Obtains the source subtitles for a validated request.
pub async fn obtain(
    ctx: &Ctx<'_>,
    video_url: &str,
    wanted_language: Option<&str>,
    force_whisper: bool,
    transcription: Option<&TranscriptionTarget>,
    stage: &(dyn Fn(Stage) + Send + Sync),
) -> Result<Source, Error> {
    stage(Stage::Fetching);
    let url = Url::parse(video_url)
        .map_err(|_| Error::new(ErrorCode::InvalidUrl, "invalid video URL"))?;
    let via_ytdlp = ctx.tools.yt_dlp.is_some() && is_video_site(&url, &ctx.cfg.tools.video_sites);
    let media = if via_ytdlp {
        let info = ytdlp_info(ctx, url.as_str()).await?;
        if !force_whisper {
            if let Some((lang, sub_url)) = choose_ytdlp_subtitle(&info, wanted_language) {
                let sub_url = Url::parse(&sub_url)
                    .map_err(|_| not_found("yt-dlp gave an invalid subtitle URL"))?;
                let cues = fetch_captions(ctx, &sub_url).await?;
                return Ok(Source {
                    cues,
                    language: Some(lang),
                    transcribed: false,
                });
            }
        }
        Media::YtDlp(url.to_string())
    } else {
        let page = fetch_page(ctx, &url).await?;
        match page.body {
            None => Media::Url(page.url),
            Some(body) => {
                let text = String::from_utf8_lossy(&body);
                let ct = page.content_type.to_ascii_lowercase();
                if let Some(format) = formats::detect(&text) {
                    if force_whisper {
                        return Err(not_found(
                            "force_whisper: the URL is a subtitle file, not media",
                        ));
                    }
                    let cues = match format {
                        formats::Format::Srt => formats::srt::parse(&text),
                        formats::Format::Vtt => formats::vtt::parse(&text),
                    };
                    return Ok(Source {
                        cues,
                        language: None,
                        transcribed: false,
                    });
                }
                let looks_html = ct.contains("html") || text.trim_start().starts_with('<');
                if !looks_html {
                    return Err(not_found(format!(
                        "{} is not a video page, media or subtitle file",
                        url_for_log(&url)
                    )));
                }
                let scanned = html::scan(&text);
                let base = scanned
                    .base_href
                    .as_deref()
                    .and_then(|b| page.url.join(b).ok())
                    .unwrap_or_else(|| page.url.clone());
                if !force_whisper {
                    if let Some(track) = html::choose_track(&scanned.tracks, wanted_language) {
                        let track_url = base
                            .join(&track.src)
                            .map_err(|_| not_found("the caption track URL is invalid"))?;
                        let cues = fetch_captions(ctx, &track_url).await?;
                        return Ok(Source {
                            cues,
                            language: track.srclang.clone(),
                            transcribed: false,
                        });
                    }
                }
                match scanned.media.iter().find_map(|m| base.join(m).ok()) {
                    Some(m) => Media::Url(m),
                    None if ctx.tools.yt_dlp.is_some() => {
                        // unknown page layout: yt-dlp's extractors may still find something
                        let info = ytdlp_info(ctx, url.as_str()).await?;
                        if !force_whisper {
                            if let Some((lang, sub_url)) =
                                choose_ytdlp_subtitle(&info, wanted_language)
                            {
                                let sub_url = Url::parse(&sub_url).map_err(|_| {
                                    not_found("yt-dlp gave an invalid subtitle URL")
                                })?;
                                let cues = fetch_captions(ctx, &sub_url).await?;
                                return Ok(Source {
                                    cues,
                                    language: Some(lang),
                                    transcribed: false,
                                });
                            }
                        }
                        Media::YtDlp(url.to_string())
                    }
                    None => return Err(not_found(
                        "the page has no caption track and no media (and yt-dlp is not installed)",
                    )),
                }
            }
        }
    };
    let Some(target) = transcription else {
        return Err(transcription_failed(
            "the video has no caption track and no transcription backend is configured \
             (transcription.url)",
        ));
    };
    stage(Stage::Transcribing);
    let work = tempfile::Builder::new()
        .prefix("job-")
        .tempdir_in(ctx.media_dir)
        .map_err(|e| transcription_failed(format!("cannot create a work directory: {e}")))?;
    let fetched = match media {
        Media::Url(u) => download(ctx, &u, work.path()).await?,
        Media::YtDlp(u) => ytdlp_download(ctx, &u, work.path()).await?,
    };
    let (media_path, container) = checked_container(&fetched, work.path()).await?;
    let (audio, file_name) = match &ctx.tools.ffmpeg {
        Some(ffmpeg) => {
            let out = work.path().join("audio.mp3");
            let (Some(input), Some(output)) = (media_path.to_str(), out.to_str()) else {
                return Err(transcription_failed("work path is not UTF-8"));
            };
            // local input only, with the demuxer of the sniffed container: no playlist or
            // concat list can make ffmpeg open what the fetch guard did not check
            let input = format!("file:{input}");
            let output = format!("file:{output}");
            tools::run(
                &ffmpeg.path,
                &[
                    "-nostdin",
                    "-v",
                    "error",
                    "-y",
                    "-protocol_whitelist",
                    "file",
                    "-f",
                    container.demuxer(),
                    "-i",
                    &input,
                    "-vn",
                    "-ac",
                    "1",
                    "-ar",
                    "16000",
                    "-c:a",
                    "libmp3lame",
                    "-b:a",
                    "32k",
                    "-f",
                    "mp3",
                    &output,
                ],
                ctx.cfg.tools.timeout.0,
            )
            .await
            .map_err(|e| {
                transcription_failed(format!("ffmpeg could not extract the audio: {e}"))
            })?;
            (out, "audio.mp3".to_string())
        }
        None => (media_path, container.file_name().to_string()),
    };
    let size = tokio::fs::metadata(&audio)
        .await
        .map(|m| m.len())
        .map_err(|e| transcription_failed(format!("reading the audio: {e}")))?;
    if size > ctx.cfg.transcription.max_upload.0 {
        return Err(transcription_failed(format!(
            "the audio is {size} bytes, above transcription.max_upload"
        )));
    }
    let bytes = tokio::fs::read(&audio)
        .await
        .map_err(|e| transcription_failed(format!("reading the audio: {e}")))?;
    drop(work);
    let http = if target.url_from_caller {
        ctx.fetch_http
    } else {
        ctx.http
    };
    let t =
        providers::transcribe(http, &ctx.retry, target, bytes, &file_name, wanted_language).await?;
    let cues: Vec<Cue> = t.cues.into_iter().filter(|c| !c.text.is_empty()).collect();
    if cues.is_empty() {
        return Err(transcription_failed(
            "the transcription has no speech segments",
        ));
    }
    Ok(Source {
        cues,
        language: t.language,
        transcribed: true,
    })
}

/// Streams a media URL to a file in `dir`, within `limits.max_media_size`.
async fn download(ctx: &Ctx<'_>, url: &Url, dir: &Path) -> Result<PathBuf, Error> {
    use tokio::io::AsyncWriteExt as _;
    let resp = guarded_get(ctx, url).await?;
    if !resp.status().is_success() {
        return Err(not_found(format!(
            "video not accessible: {} answered HTTP {}",
            url_for_log(url),
            resp.status().as_u16()
        )));
    }
    // never the caller's name or extension: the container is decided by the bytes
    let path = dir.join("download");
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| transcription_failed(format!("cannot store the media: {e}")))?;
    let max = ctx.cfg.limits.max_media_size.0;
    let mut written = 0u64;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| not_found("video not accessible: the download broke off"))?;
        written += chunk.len() as u64;
        if written > max {
            return Err(transcription_failed(
                "the media is larger than limits.max_media_size",
            ));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| transcription_failed(format!("cannot store the media: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| transcription_failed(format!("cannot store the media: {e}")))?;
    Ok(path)
}

/// Checks the downloaded file's container by its first bytes and renames it to the container's
/// fixed name. Anything else (a playlist, a page, a subtitle file) is refused as not media.
async fn checked_container(fetched: &Path, dir: &Path) -> Result<(PathBuf, Container), Error> {
    use tokio::io::AsyncReadExt as _;
    let read_failed = |e: std::io::Error| transcription_failed(format!("reading the media: {e}"));
    let mut head = Vec::with_capacity(media::SNIFF_LEN);
    tokio::fs::File::open(fetched)
        .await
        .map_err(read_failed)?
        .take(media::SNIFF_LEN as u64)
        .read_to_end(&mut head)
        .await
        .map_err(read_failed)?;
    let Some(container) = media::sniff(&head) else {
        return Err(not_found(
            "the media is not an audio or video container this service accepts (WAV, MP3, \
             AAC, FLAC, Ogg, Matroska/WebM, MP4/MOV, MPEG-TS/PS, AVI, AIFF, ASF, FLV); \
             playlists are refused",
        ));
    };
    let path = dir.join(container.file_name());
    tokio::fs::rename(fetched, &path)
        .await
        .map_err(|e| transcription_failed(format!("storing the media: {e}")))?;
    Ok((path, container))
}

/// `yt-dlp -f bestaudio/best` into `dir`.
async fn ytdlp_download(ctx: &Ctx<'_>, url: &str, dir: &Path) -> Result<PathBuf, Error> {
    let Some(tool) = &ctx.tools.yt_dlp else {
        return Err(not_found("yt-dlp is not installed"));
    };
    let template = dir.join("ytdlp.%(ext)s");
    let Some(template) = template.to_str() else {
        return Err(transcription_failed("work path is not UTF-8"));
    };
    check_for_ytdlp(ctx, url).await?;
    let max = format!("{}", ctx.cfg.limits.max_media_size.0);
    let mut args = vec![
        "--no-playlist",
        "--no-warnings",
        "--no-progress",
        "-f",
        "bestaudio/best",
        "--max-filesize",
        &max,
        "-o",
        template,
    ];
    if let Some(p) = &ctx.ytdlp_proxy {
        args.extend(["--proxy", p.as_str()]);
    }
    args.push(url);
    tools::run(&tool.path, &args, ctx.cfg.tools.timeout.0)
        .await
        .map_err(|e| not_found(format!("video not accessible (yt-dlp: {e})")))?;
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| transcription_failed(format!("reading the download: {e}")))?;
    while let Ok(Some(e)) = entries.next_entry().await {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("ytdlp.") && !name.ends_with(".part") {
            return Ok(e.path());
        }
    }
    Err(not_found("yt-dlp downloaded nothing"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn video_sites_match_subdomains() {
        let sites = vec!["youtube.com".to_string(), "localhost".to_string()];
        assert!(is_video_site(
            &Url::parse("https://www.youtube.com/watch?v=x").unwrap(),
            &sites
        ));
        assert!(is_video_site(
            &Url::parse("https://youtube.com/x").unwrap(),
            &sites
        ));
        assert!(is_video_site(
            &Url::parse("http://localhost:8080/x").unwrap(),
            &sites
        ));
        assert!(!is_video_site(
            &Url::parse("https://notyoutube.com/x").unwrap(),
            &sites
        ));
        assert!(!is_video_site(
            &Url::parse("http://127.0.0.1/x").unwrap(),
            &sites
        ));
    }

    #[test]
    fn media_types() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(is_media_type("audio/mpeg", &u("http://h/x")));
        assert!(is_media_type("video/mp4; codecs=x", &u("http://h/x")));
        assert!(is_media_type(
            "application/octet-stream",
            &u("http://h/a.WAV")
        ));
        assert!(is_media_type("", &u("http://h/a.mp3")));
        assert!(!is_media_type("text/html", &u("http://h/a.mp3")));
        assert!(!is_media_type(
            "application/octet-stream",
            &u("http://h/a.vtt")
        ));
    }

    #[test]
    fn ytdlp_subtitle_choice() {
        let info = json!({
            "language": "en",
            "subtitles": {
                "de": [{"ext": "srv3", "url": "http://s/de.srv3"}, {"ext": "vtt", "url": "http://s/de.vtt"}],
                "en": [{"ext": "json3", "url": "http://s/en.json3"}]
            },
            "automatic_captions": {
                "en-orig": [{"ext": "vtt", "url": "http://s/en-orig.vtt"}],
                "fr": [{"ext": "vtt", "url": "http://s/fr-auto.vtt"}]
            }
        });
        assert_eq!(
            choose_ytdlp_subtitle(&info, Some("de")).unwrap().1,
            "http://s/de.vtt"
        );
        assert_eq!(
            choose_ytdlp_subtitle(&info, None).unwrap().1,
            "http://s/en-orig.vtt",
            "manual en has no parseable format: the original-language auto track"
        );
        assert_eq!(
            choose_ytdlp_subtitle(&info, Some("fr")).unwrap().1,
            "http://s/fr-auto.vtt"
        );
        let only_auto =
            json!({"automatic_captions": {"es": [{"ext": "vtt", "url": "http://s/es.vtt"}]}});
        assert_eq!(
            choose_ytdlp_subtitle(&only_auto, None),
            None,
            "machine translations are not sources"
        );
        assert_eq!(choose_ytdlp_subtitle(&json!({}), Some("en")), None);
        let generic = json!({"subtitles": {"en": [{"url": "http://l/subs/en.vtt", "ext": "vtt"}]}});
        assert_eq!(
            choose_ytdlp_subtitle(&generic, None),
            Some(("en".into(), "http://l/subs/en.vtt".into()))
        );
    }
}
