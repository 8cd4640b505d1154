//! TURN ChannelData framing (RFC 8656 §12.4): channel number (0x4000..=0x4FFF), length, data.
//! Over UDP no padding is needed, and a received frame's padding is ignored.

pub const MIN_CHANNEL: u16 = 0x4000;
pub const MAX_CHANNEL: u16 = 0x4FFF;

/// The channel number and the application data of a ChannelData frame, or None when the
/// datagram is not one (too short, channel out of range, length beyond the datagram).
pub fn decode(datagram: &[u8]) -> Option<(u16, &[u8])> {
    let header = datagram.get(..4)?;
    let channel = u16::from_be_bytes([header[0], header[1]]);
    if !(MIN_CHANNEL..=MAX_CHANNEL).contains(&channel) {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
    Some((channel, datagram.get(4..4 + len)?))
}

/// Frames `data` for `channel` (the data must fit the 16-bit length, as any UDP payload does).
pub fn encode(channel: u16, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + data.len());
    encode_into(channel, data, &mut out);
    out
}

/// [`encode`] appending to `out`.
/// `data` must fit the 16-bit length (the caller checks); longer data is cut there.
pub fn encode_into(channel: u16, data: &[u8], out: &mut Vec<u8>) {
    let data = &data[..data.len().min(usize::from(u16::MAX))];
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_padding_ignored() {
        let frame = encode(0x4001, b"hello");
        assert_eq!(decode(&frame), Some((0x4001, &b"hello"[..])));
        let mut padded = frame.clone();
        padded.extend_from_slice(&[0, 0, 0]);
        assert_eq!(decode(&padded), Some((0x4001, &b"hello"[..])));
    }

    #[test]
    fn rejects_short_out_of_range_and_overlong() {
        assert_eq!(decode(&[0x40]), None);
        assert_eq!(decode(&[0x50, 0, 0, 0]), None);
        assert_eq!(decode(&[0x3F, 0xFF, 0, 0]), None);
        assert_eq!(decode(&[0x40, 0, 0, 9, 1, 2]), None);
    }
}
