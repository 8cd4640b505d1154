//! `switchyard subtitles`: the subtitle transcription and translation service (spec Part B).
#![forbid(unsafe_code)]

pub mod batching;
pub mod error;
pub mod formats;
pub mod html;
pub mod languages;
pub mod ratelimit;
pub mod request;
pub mod retry;
