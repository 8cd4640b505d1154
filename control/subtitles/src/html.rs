//! Finds caption tracks and media sources in an HTML page (runtime-free): `<track>` elements
//! (`src`, `kind`, `srclang`, `label`, `default`), `<video src>` / `<audio src>` / `<source src>`,
//! and `<base href>` for resolving relative URLs. A small tag scanner, not a full HTML parser:
//! comments and the contents of `<script>` / `<style>` are skipped, attribute values may be
//! quoted or not, character references in them are decoded.

use crate::formats::vtt::decode_entities;
use crate::languages;

/// A `<track>` element.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Track {
    pub src: String,
    pub kind: Option<String>,
    pub srclang: Option<String>,
    pub label: Option<String>,
    pub default: bool,
}

/// What a page offers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PageMedia {
    pub tracks: Vec<Track>,
    /// `src` of `<video>`, `<audio>` and their `<source>` children, in document order.
    pub media: Vec<String>,
    pub base_href: Option<String>,
}

/// Scans `html` for tracks, media and the base URL.
pub fn scan(html: &str) -> PageMedia {
    let mut page = PageMedia::default();
    let lower = html.to_ascii_lowercase();
    let mut pos = 0;
    let mut in_media = 0usize;
    while let Some(off) = html[pos..].find('<') {
        let start = pos + off;
        if lower[start..].starts_with("<!--") {
            pos = lower[start..]
                .find("-->")
                .map_or(html.len(), |e| start + e + 3);
            continue;
        }
        let Some((name, attrs, end)) = parse_tag(html, start) else {
            pos = start + 1;
            continue;
        };
        pos = end;
        match name.as_str() {
            "script" | "style" => {
                let close = format!("</{name}");
                pos = lower[pos..].find(&close).map_or(html.len(), |e| pos + e);
            }
            "video" | "audio" => {
                in_media += 1;
                if let Some(src) = attr(&attrs, "src") {
                    page.media.push(src);
                }
            }
            "/video" | "/audio" => in_media = in_media.saturating_sub(1),
            "source" if in_media > 0 => {
                let is_image = attr(&attrs, "type").is_some_and(|t| t.starts_with("image/"));
                if let (Some(src), false) = (attr(&attrs, "src"), is_image) {
                    page.media.push(src);
                }
            }
            "track" => {
                if let Some(src) = attr(&attrs, "src") {
                    page.tracks.push(Track {
                        src,
                        kind: attr(&attrs, "kind").map(|k| k.to_ascii_lowercase()),
                        srclang: attr(&attrs, "srclang"),
                        label: attr(&attrs, "label"),
                        default: attrs.iter().any(|(k, _)| k == "default"),
                    });
                }
            }
            "base" if page.base_href.is_none() => page.base_href = attr(&attrs, "href"),
            _ => {}
        }
    }
    page
}

fn attr(attrs: &[(String, String)], name: &str) -> Option<String> {
    attrs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

type Attrs = Vec<(String, String)>;

/// Parses the tag at `start` (`<`): (lowercase name with a leading `/` for end tags,
/// attributes with lowercase names, index after `>`).
fn parse_tag(html: &str, start: usize) -> Option<(String, Attrs, usize)> {
    let bytes = html.as_bytes();
    let mut i = start + 1;
    let closing = bytes.get(i) == Some(&b'/');
    if closing {
        i += 1;
    }
    let name_start = i;
    while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'-') {
        i += 1;
    }
    if i == name_start {
        return None;
    }
    let mut name = html[name_start..i].to_ascii_lowercase();
    if closing {
        name.insert(0, '/');
    }
    let mut attrs = Vec::new();
    loop {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b'/') {
            i += 1;
        }
        match bytes.get(i) {
            None => return None,
            Some(b'>') => return Some((name, attrs, i + 1)),
            _ => {}
        }
        let key_start = i;
        while i < bytes.len()
            && !bytes[i].is_ascii_whitespace()
            && !matches!(bytes[i], b'=' | b'>' | b'/')
        {
            i += 1;
        }
        let key = html[key_start..i].to_ascii_lowercase();
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if bytes.get(i) == Some(&b'=') {
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            match bytes.get(i) {
                Some(&q @ (b'"' | b'\'')) => {
                    let v_start = i + 1;
                    let v_end = html[v_start..].find(q as char)? + v_start;
                    value = decode_entities(&html[v_start..v_end]);
                    i = v_end + 1;
                }
                _ => {
                    let v_start = i;
                    while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'>' {
                        i += 1;
                    }
                    value = decode_entities(&html[v_start..i]);
                }
            }
        }
        if !key.is_empty() {
            attrs.push((key, value));
        }
    }
}

/// The caption track to use: among `subtitles`/`captions` tracks (no `kind` counts as
/// subtitles), the one in `wanted` language, else the `default` one, else the first.
pub fn choose_track<'a>(tracks: &'a [Track], wanted: Option<&str>) -> Option<&'a Track> {
    let usable: Vec<&Track> = tracks
        .iter()
        .filter(|t| {
            t.kind
                .as_deref()
                .is_none_or(|k| k == "subtitles" || k == "captions")
        })
        .collect();
    if let Some(w) = wanted {
        let hit = usable.iter().find(|t| {
            t.srclang
                .as_deref()
                .is_some_and(|l| languages::same_language(l, w))
        });
        if let Some(t) = hit {
            return Some(t);
        }
    }
    usable
        .iter()
        .find(|t| t.default)
        .or_else(|| usable.first())
        .copied()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<!doctype html><html><head><BASE HREF="/media/">
<script>var s = "<track src='no.vtt'>";</script><style>video > track {}</style></head>
<body><!-- <track src="commented.vtt"> -->
<video controls poster=poster.jpg>
  <source src="talk.webm" type="video/webm">
  <source src='talk.mp4' type=video/mp4>
  <track kind=subtitles src="subs/en.vtt" srclang=en label="English" default>
  <TRACK Kind="captions" Src="subs/fr.vtt?a=1&amp;b=2" SrcLang="fr-FR" />
  <track kind="chapters" src="chapters.vtt" srclang="es">
  <track kind="descriptions" src="desc.vtt" srclang="de">
</video>
<picture><source srcset="x.webp" type="image/webp"></picture>
<source src="outside.mp4">
<audio src="podcast.mp3"></audio>
<p>a < b and <unclosed
"#;

    #[test]
    fn finds_tracks_media_and_base() {
        let page = scan(PAGE);
        assert_eq!(page.base_href.as_deref(), Some("/media/"));
        assert_eq!(page.media, ["talk.webm", "talk.mp4", "podcast.mp3"]);
        let srcs: Vec<&str> = page.tracks.iter().map(|t| t.src.as_str()).collect();
        assert_eq!(
            srcs,
            [
                "subs/en.vtt",
                "subs/fr.vtt?a=1&b=2",
                "chapters.vtt",
                "desc.vtt"
            ]
        );
        assert!(page.tracks[0].default);
        assert_eq!(page.tracks[1].kind.as_deref(), Some("captions"));
        assert_eq!(page.tracks[1].srclang.as_deref(), Some("fr-FR"));
        assert_eq!(page.tracks[0].label.as_deref(), Some("English"));
    }

    #[test]
    fn chooses_a_track() {
        let page = scan(PAGE);
        assert_eq!(
            choose_track(&page.tracks, Some("fr")).unwrap().src,
            "subs/fr.vtt?a=1&b=2"
        );
        assert_eq!(choose_track(&page.tracks, None).unwrap().src, "subs/en.vtt");
        assert_eq!(
            choose_track(&page.tracks, Some("es")).unwrap().src,
            "subs/en.vtt",
            "chapters are not subtitles"
        );
        let no_default = vec![
            Track {
                src: "a.vtt".into(),
                ..Track::default()
            },
            Track {
                src: "b.vtt".into(),
                ..Track::default()
            },
        ];
        assert_eq!(choose_track(&no_default, None).unwrap().src, "a.vtt");
        assert!(choose_track(&[], None).is_none());
    }

    #[test]
    fn garbage_does_not_panic() {
        for s in [
            "<",
            "<<<>>>",
            "<track src=",
            "<track src=\"unterminated",
            "<video><source",
            "é<tràck src=ü>",
            "<!--",
        ] {
            let _ = scan(s);
        }
        assert!(scan("<track src=\"unterminated").tracks.is_empty());
    }
}
