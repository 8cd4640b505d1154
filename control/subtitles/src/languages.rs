//! The supported language codes (spec Part B) and mapping of what sources report (`en-US`,
//! `zh-Hant`, Whisper's `english`) onto them.

/// Supported target (and source) language codes, exactly as the spec lists them.
pub const SUPPORTED: [&str; 13] = [
    "en", "es", "fr", "de", "pt", "ru", "it", "ja", "ko", "zh-CN", "zh-TW", "ar", "hi",
];

/// English names, for prompts and for Whisper's `language` answer.
const NAMES: [(&str, &str); 13] = [
    ("en", "English"),
    ("es", "Spanish"),
    ("fr", "French"),
    ("de", "German"),
    ("pt", "Portuguese"),
    ("ru", "Russian"),
    ("it", "Italian"),
    ("ja", "Japanese"),
    ("ko", "Korean"),
    ("zh-CN", "Simplified Chinese"),
    ("zh-TW", "Traditional Chinese"),
    ("ar", "Arabic"),
    ("hi", "Hindi"),
];

/// The code when it is in the supported list (exact spelling, as the spec gives it).
pub fn supported(code: &str) -> Option<&'static str> {
    SUPPORTED.iter().copied().find(|c| *c == code)
}

/// A human name for prompts: the English name of a supported code, else the code itself.
pub fn display_name(code: &str) -> String {
    NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| code.to_string())
}

/// Maps a language tag or name reported by a source (a `<track srclang>`, a yt-dlp subtitle
/// language, Whisper's `language`) to a supported code when it names one; otherwise `None`.
pub fn normalize(tag: &str) -> Option<&'static str> {
    let t = tag.trim();
    if t.is_empty() {
        return None;
    }
    if let Some(c) = supported(t) {
        return Some(c);
    }
    let lower = t.to_ascii_lowercase().replace('_', "-");
    if let Some((c, _)) = NAMES.iter().find(|(_, n)| n.eq_ignore_ascii_case(&lower)) {
        return Some(c);
    }
    let mut parts = lower.split('-');
    let primary = parts.next().unwrap_or_default();
    if primary == "zh" || lower == "chinese" {
        let traditional = lower
            .split('-')
            .skip(1)
            .any(|p| matches!(p, "tw" | "hk" | "mo" | "hant"));
        return Some(if traditional { "zh-TW" } else { "zh-CN" });
    }
    SUPPORTED
        .iter()
        .copied()
        .find(|c| !c.contains('-') && *c == primary)
}

/// The ISO-639-1 code a transcription endpoint takes as `language` (`zh-CN` → `zh`).
pub fn iso639_1(code: &str) -> &str {
    code.split('-').next().unwrap_or(code)
}

/// Whether two codes name the same language for the purpose of skipping a translation.
pub fn same_language(a: &str, b: &str) -> bool {
    match (normalize(a), normalize(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_spec_list() {
        for c in SUPPORTED {
            assert_eq!(supported(c), Some(c));
        }
        for bad in [
            "", "EN", "zh", "zh-cn", "zh_CN", "xx", "english", " en", "pt-BR",
        ] {
            assert_eq!(supported(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn normalizes_what_sources_report() {
        assert_eq!(normalize("en-US"), Some("en"));
        assert_eq!(normalize("EN"), Some("en"));
        assert_eq!(normalize("english"), Some("en"));
        assert_eq!(normalize("zh-Hant"), Some("zh-TW"));
        assert_eq!(normalize("zh_TW"), Some("zh-TW"));
        assert_eq!(normalize("zh-Hans"), Some("zh-CN"));
        assert_eq!(normalize("zh"), Some("zh-CN"));
        assert_eq!(normalize("pt-BR"), Some("pt"));
        assert_eq!(normalize("nl"), None);
        assert_eq!(normalize(""), None);
        assert_eq!(iso639_1("zh-TW"), "zh");
        assert!(same_language("en-GB", "en"));
        assert!(!same_language("zh-TW", "zh-CN"));
        assert_eq!(display_name("ja"), "Japanese");
        assert_eq!(display_name("nl"), "nl");
    }
}
