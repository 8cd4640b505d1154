//! Media containers recognised by their first bytes (runtime-free).
//!
//! Downloaded media is only handed to ffmpeg (or uploaded for transcription) when its bytes
//! start like one of the audio/video containers below. ffmpeg otherwise picks its demuxer by
//! probing the content and the file name, and some demuxers read other resources: an HLS
//! playlist (`#EXTM3U`) or an `ffconcat` list names URLs and local files that the fetch guard
//! never saw. So the caller's file name is never kept: the file is renamed to a fixed name
//! from the sniffed container ([`Container::file_name`]) and ffmpeg is told the demuxer
//! ([`Container::demuxer`]) and given `-protocol_whitelist file`.

/// How many leading bytes [`sniff`] looks at (MPEG-TS needs three 188-byte packets).
pub const SNIFF_LEN: usize = 3 * TS_PACKET;

const TS_PACKET: usize = 188;

/// An accepted audio/video container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    Wav,
    Avi,
    Aiff,
    Mp3,
    Aac,
    Flac,
    Ogg,
    Matroska,
    Mp4,
    MpegTs,
    MpegPs,
    Asf,
    Flv,
}

impl Container {
    /// ffmpeg's demuxer for `-f` (so ffmpeg never probes for another one).
    pub fn demuxer(self) -> &'static str {
        match self {
            Container::Wav => "wav",
            Container::Avi => "avi",
            Container::Aiff => "aiff",
            Container::Mp3 => "mp3",
            Container::Aac => "aac",
            Container::Flac => "flac",
            Container::Ogg => "ogg",
            Container::Matroska => "matroska",
            Container::Mp4 => "mov",
            Container::MpegTs => "mpegts",
            Container::MpegPs => "mpeg",
            Container::Asf => "asf",
            Container::Flv => "flv",
        }
    }

    /// The fixed local file name (its extension also tells a transcription backend the format
    /// when the media is uploaded as fetched).
    pub fn file_name(self) -> &'static str {
        match self {
            Container::Wav => "media.wav",
            Container::Avi => "media.avi",
            Container::Aiff => "media.aiff",
            Container::Mp3 => "media.mp3",
            Container::Aac => "media.aac",
            Container::Flac => "media.flac",
            Container::Ogg => "media.ogg",
            Container::Matroska => "media.mkv",
            Container::Mp4 => "media.mp4",
            Container::MpegTs => "media.ts",
            Container::MpegPs => "media.mpg",
            Container::Asf => "media.wma",
            Container::Flv => "media.flv",
        }
    }
}

/// The container `head` (the file's first bytes, up to [`SNIFF_LEN`]) starts like, if any.
pub fn sniff(head: &[u8]) -> Option<Container> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    if at(0, b"RIFF") {
        return if at(8, b"WAVE") {
            Some(Container::Wav)
        } else if at(8, b"AVI ") {
            Some(Container::Avi)
        } else {
            None
        };
    }
    if at(0, b"FORM") && (at(8, b"AIFF") || at(8, b"AIFC")) {
        return Some(Container::Aiff);
    }
    if at(0, b"fLaC") {
        return Some(Container::Flac);
    }
    if at(0, b"OggS") {
        return Some(Container::Ogg);
    }
    if at(0, &[0x1a, 0x45, 0xdf, 0xa3]) {
        return Some(Container::Matroska);
    }
    // ISO base media (MP4, M4A, MOV, 3GP): a box size, then the first box type
    if [b"ftyp", b"moov", b"mdat", b"wide", b"free"]
        .iter()
        .any(|t| at(4, *t))
    {
        return Some(Container::Mp4);
    }
    if at(
        0,
        &[
            0x30, 0x26, 0xb2, 0x75, 0x8e, 0x66, 0xcf, 0x11, 0xa6, 0xd9, 0x00, 0xaa, 0x00, 0x62,
            0xce, 0x6c,
        ],
    ) {
        return Some(Container::Asf);
    }
    if at(0, b"FLV\x01") {
        return Some(Container::Flv);
    }
    if at(0, &[0x00, 0x00, 0x01, 0xba]) {
        return Some(Container::MpegPs);
    }
    // MPEG-TS: the sync byte at the start of (up to) three consecutive packets
    let packets = (head.len() / TS_PACKET).clamp(1, 3);
    if head.len() >= TS_PACKET && (0..packets).all(|i| head[i * TS_PACKET] == 0x47) {
        return Some(Container::MpegTs);
    }
    if at(0, b"ID3") {
        return Some(Container::Mp3);
    }
    match head {
        // MPEG audio frame sync: layer bits 00 are ADTS (AAC), others MPEG-1/2 layer I-III
        [0xff, b, ..] if b & 0xe0 == 0xe0 => {
            if b & 0x06 == 0 {
                Some(Container::Aac)
            } else {
                Some(Container::Mp3)
            }
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn padded(prefix: &[u8]) -> Vec<u8> {
        let mut v = prefix.to_vec();
        v.resize(SNIFF_LEN, 0x20);
        v
    }

    #[test]
    fn containers_by_their_bytes() {
        let cases: [(&[u8], Container); 14] = [
            (b"RIFF\x24\x00\x00\x00WAVEfmt ", Container::Wav),
            (b"RIFF\x24\x00\x00\x00AVI LIST", Container::Avi),
            (b"FORM\x00\x00\x00\x00AIFFCOMM", Container::Aiff),
            (b"fLaC\x00\x00\x00\x22", Container::Flac),
            (b"OggS\x00\x02", Container::Ogg),
            (&[0x1a, 0x45, 0xdf, 0xa3, 0x9f], Container::Matroska),
            (b"\x00\x00\x00\x20ftypisom", Container::Mp4),
            (b"\x00\x00\x00\x20ftypM4A ", Container::Mp4),
            (b"ID3\x04\x00\x00", Container::Mp3),
            (&[0xff, 0xfb, 0x90, 0x64], Container::Mp3),
            (&[0xff, 0xf1, 0x50, 0x80], Container::Aac),
            (&[0x00, 0x00, 0x01, 0xba, 0x44], Container::MpegPs),
            (b"FLV\x01\x05", Container::Flv),
            (
                &[
                    0x30, 0x26, 0xb2, 0x75, 0x8e, 0x66, 0xcf, 0x11, 0xa6, 0xd9, 0x00, 0xaa, 0x00,
                    0x62, 0xce, 0x6c,
                ],
                Container::Asf,
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(sniff(&padded(bytes)), Some(want), "{bytes:?}");
            assert!(want.file_name().starts_with("media."));
        }
        let mut ts = vec![0u8; SNIFF_LEN];
        for i in 0..3 {
            ts[i * TS_PACKET] = 0x47;
        }
        assert_eq!(sniff(&ts), Some(Container::MpegTs));
        ts[2 * TS_PACKET] = 0;
        assert_eq!(sniff(&ts), None, "one sync byte is not enough");
    }

    #[test]
    fn playlists_and_other_text_are_refused() {
        for text in [
            "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nhttp://127.0.0.1:1/seg.ts\n",
            "ffconcat version 1.0\nfile 'http://127.0.0.1:1/a.wav'\n",
            "[playlist]\nFile1=http://127.0.0.1:1/a.mp3\n",
            "<?xml version=\"1.0\"?><MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">",
            "<html><body>not media</body></html>",
            "WEBVTT\n\n00:00.000 --> 00:01.000\nhi\n",
            "",
            "RIFF",
        ] {
            assert_eq!(sniff(text.as_bytes()), None, "{text:?}");
            assert_eq!(sniff(&padded(text.as_bytes())), None, "{text:?}");
        }
        assert_eq!(
            sniff(b"RIFF\x00\x00\x00\x00CDXA"),
            None,
            "RIFF of another kind"
        );
    }
}
