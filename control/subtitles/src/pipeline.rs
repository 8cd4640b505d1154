//! One job from validated request to translated segments: translation cache, source
//! subtitles ([`source`](crate::source)), batched translation ([`batching`](crate::batching))
//! through the chat provider, events for the stream, progress in the job store.
//!
//! Only translations by the server's own provider (tiers 3–4) are cached, keyed by that
//! provider's identity and model: a tier 1–2 caller's endpoint is theirs, and their key can
//! change what a model name means (gateways map models per key), so what their provider
//! answered is never served to anyone else, and they are never served what another provider
//! answered. Tier 1–2 repeats ask their provider again (on their own key).
//!
//! Progress (`progress` events and the job's `progress`): `fetching` 2, `transcribing` 10,
//! then `translating` from 10 (captions) or 40 (transcribed) up to 95 in proportion to the
//! segments translated; 100 when completed.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::batching::{BatchConfig, BatchPlan, Outcome};
use crate::error::{Error, ErrorCode};
use crate::formats;
use crate::languages;
use crate::providers::{self, ChatTarget, TranscriptionTarget};
use crate::request::{TranscriptionRoute, Validated};
use crate::source::{self, Stage};
use crate::store::{CacheKey, CachedTranslation, Segment};
use crate::App;

/// Where stream events go (`None` for `/api/translate`).
#[derive(Clone, Default)]
pub struct EventSink(pub Option<mpsc::Sender<Value>>);

fn cancelled() -> Error {
    Error::new(ErrorCode::Cancelled, "cancelled: the client disconnected")
}

impl EventSink {
    async fn send(&self, v: Value) -> Result<(), Error> {
        match &self.0 {
            Some(tx) => tx.send(v).await.map_err(|_| cancelled()),
            None => Ok(()),
        }
    }

    /// A `progress` event: `job_id`, `stage`, `progress` (0–100), `completed` and `total`
    /// segments.
    pub fn progress_event(
        job_id: &str,
        stage: &str,
        progress: f64,
        completed: usize,
        total: usize,
    ) -> Value {
        json!({
            "type": "progress",
            "job_id": job_id,
            "stage": stage,
            "progress": (progress * 10.0).round() / 10.0,
            "completed": completed,
            "total": total,
        })
    }

    async fn subtitle(&self, index: usize, s: &Segment) -> Result<(), Error> {
        self.send(json!({
            "type": "subtitle",
            "index": index,
            "start": s.start,
            "end": s.end,
            "text": s.text,
        }))
        .await
    }
}

/// A finished job.
#[derive(Debug, Clone)]
pub struct Done {
    pub subtitles: Vec<Segment>,
    pub source_language: String,
    pub cached: bool,
}

async fn progress(
    app: &App,
    sink: &EventSink,
    job_id: &str,
    stage: &str,
    value: f64,
    completed: usize,
    total: usize,
) -> Result<(), Error> {
    app.store.set_progress(job_id, value, completed).await?;
    sink.send(EventSink::progress_event(
        job_id, stage, value, completed, total,
    ))
    .await
}

/// Runs the job; the caller records the outcome in the store.
pub async fn run_job(
    app: &Arc<App>,
    job_id: &str,
    req: &Validated,
    sink: &EventSink,
) -> Result<Done, Error> {
    let provider = req
        .caller_key
        .is_none()
        .then(|| providers::provider_identity(&req.translation.api_url));
    let cache_key = provider.as_deref().map(|provider| CacheKey {
        video_url: &req.video_url,
        source_language: req.source_language.unwrap_or("auto"),
        target_language: req.target_language,
        provider,
        model: &req.translation.model,
    });
    if let (Some(key), false) = (&cache_key, req.force_whisper) {
        if let Some(hit) = app.store.cached(key).await? {
            let n = hit.subtitles.len();
            tracing::info!(job_id, segments = n, "translation cache hit");
            progress(app, sink, job_id, "cached", 100.0, n, n).await?;
            for (i, s) in hit.subtitles.iter().enumerate() {
                sink.subtitle(i, s).await?;
            }
            return Ok(Done {
                subtitles: hit.subtitles,
                source_language: hit.source_language,
                cached: true,
            });
        }
    }

    progress(app, sink, job_id, "fetching", 2.0, 0, 0).await?;
    let transcription = match &req.transcription {
        TranscriptionRoute::Caller(p) => Some(TranscriptionTarget {
            url: p.api_url.clone(),
            url_from_caller: p.url_from_caller,
            api_key: p.api_key.clone(),
            model: app.cfg.transcription.model.clone(),
            format: app.cfg.transcription.response_format,
            timeout: app.cfg.transcription.timeout.0,
        }),
        TranscriptionRoute::Server => app.server_transcription.clone(),
    };
    let ctx = source::Ctx {
        http: &app.http,
        fetch_http: &app.fetch_http,
        policy: &app.fetch_policy,
        ytdlp_proxy: app.guard_proxy.as_ref().map(|p| p.url()),
        cfg: &app.cfg,
        tools: &app.tools,
        retry: app.retry,
        media_dir: &app.media_dir,
    };
    let stage_sink = sink.clone();
    let stage_store = app.store.clone();
    let stage_job = job_id.to_string();
    let on_stage = move |stage: Stage| {
        if stage == Stage::Transcribing {
            // best effort: the stream may be full or gone, the store is updated in the background
            if let Some(tx) = &stage_sink.0 {
                let _ = tx.try_send(EventSink::progress_event(
                    &stage_job,
                    "transcribing",
                    10.0,
                    0,
                    0,
                ));
            }
            let store = stage_store.clone();
            let job = stage_job.clone();
            tokio::spawn(async move {
                let _ = store.set_progress(&job, 10.0, 0).await;
            });
        }
    };
    let src = source::obtain(
        &ctx,
        &req.video_url,
        req.source_language,
        req.force_whisper,
        transcription.as_ref(),
        &on_stage,
    )
    .await?;
    let cues: Vec<formats::Cue> = src
        .cues
        .into_iter()
        .filter(|c| !c.text.trim().is_empty())
        .collect();
    if cues.is_empty() {
        return Err(Error::new(
            ErrorCode::VideoNotFound,
            "the video's subtitles are empty",
        ));
    }
    let max = app.cfg.limits.max_segments as usize;
    if cues.len() > max {
        return Err(Error::new(
            ErrorCode::TranslationFailed,
            format!(
                "{} segments is more than limits.max_segments ({max})",
                cues.len()
            ),
        ));
    }
    let source_language: String = match (req.source_language, src.language.as_deref()) {
        (Some(s), _) => s.to_string(),
        (None, Some(l)) => languages::normalize(l)
            .map(str::to_string)
            .unwrap_or_else(|| l.to_string()),
        (None, None) => "auto".to_string(),
    };
    let total = cues.len();
    let base = if src.transcribed { 40.0 } else { 10.0 };
    tracing::info!(
        job_id,
        segments = total,
        source_language,
        transcribed = src.transcribed,
        "source subtitles ready"
    );
    progress(app, sink, job_id, "translating", base, 0, total).await?;

    let mut out: Vec<Segment> = Vec::with_capacity(total);
    let segment = |i: usize, text: String| Segment {
        start: formats::ms_to_seconds(cues[i].start_ms),
        end: formats::ms_to_seconds(cues[i].end_ms),
        text,
    };
    if languages::same_language(&source_language, req.target_language) {
        for (i, c) in cues.iter().enumerate() {
            let s = segment(i, c.text.clone());
            sink.subtitle(i, &s).await?;
            out.push(s);
        }
    } else {
        let texts: Vec<String> = cues.iter().map(|c| c.text.clone()).collect();
        let source_name =
            (source_language != "auto").then(|| languages::display_name(&source_language));
        let mut plan = BatchPlan::new(
            &texts,
            source_name.as_deref(),
            &languages::display_name(req.target_language),
            BatchConfig {
                batch_size: app.cfg.translation.batch_size as usize,
                context_lines: app.cfg.translation.context_lines as usize,
            },
        );
        let target = ChatTarget {
            api_url: req.translation.api_url.clone(),
            model: req.translation.model.clone(),
            api_key: req.translation.api_key.clone(),
            timeout: app.cfg.translation.timeout.0,
        };
        let chat_http = if req.translation.url_from_caller {
            &app.fetch_http
        } else {
            &app.http
        };
        while let Some(ask) = plan.next_ask() {
            let reply = providers::chat(chat_http, &app.retry, &target, &ask.messages).await?;
            match plan.answer(&reply) {
                Outcome::Accepted { range, texts } => {
                    for (i, text) in range.zip(texts) {
                        let s = segment(i, text);
                        sink.subtitle(i, &s).await?;
                        out.push(s);
                    }
                    let value = base + (95.0 - base) * out.len() as f64 / total as f64;
                    progress(app, sink, job_id, "translating", value, out.len(), total).await?;
                }
                Outcome::Reask { expected, got } => {
                    tracing::info!(
                        job_id,
                        expected,
                        got,
                        "reply line count mismatch; asking again"
                    );
                }
                Outcome::Split { expected, got } => {
                    tracing::info!(
                        job_id,
                        expected,
                        got,
                        "reply line count mismatch again; splitting the batch"
                    );
                }
                Outcome::Failed { index, got } => {
                    return Err(Error::new(
                        ErrorCode::TranslationFailed,
                        format!(
                            "the provider did not answer one line for segment {index} (got {got} lines, \
                             after asking again and splitting the batch)"
                        ),
                    ));
                }
            }
        }
    }
    let entry = CachedTranslation {
        source_language: source_language.clone(),
        subtitles: out,
    };
    if let Some(key) = &cache_key {
        app.store.store_translation(key, &entry).await?;
    }
    Ok(Done {
        subtitles: entry.subtitles,
        source_language,
        cached: false,
    })
}
