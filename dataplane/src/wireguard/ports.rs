//! The local ports a tunnel gives its flows and SOCKS5 UDP associations: the dynamic range
//! 49152–65000 (15,849 ports) as a bitmap. Allocation walks on from the last port handed out
//! (so a port just released is not reused at once) and skips full 64-port words, so it costs at
//! most one pass over 248 words — never a scan of the open flows — and says when every port is
//! taken instead of looping. A pool may hold fewer ports than the range (the backend's
//! `max_flows`).

/// First and last port of the range.
pub const FIRST: u16 = 49_152;
pub const LAST: u16 = 65_000;
const COUNT: usize = (LAST - FIRST) as usize + 1;
const WORDS: usize = COUNT.div_ceil(64);

/// As many ports as the pool may hand out are in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tunnel's {0} flows (max_flows) are all in use")]
pub struct PortsExhausted(pub usize);

#[derive(Debug, Clone)]
pub struct PortPool {
    in_use: Vec<u64>,
    used: usize,
    /// Ports that may be in use at once (at most the range's size).
    capacity: usize,
    /// Index (port - FIRST) where the next search starts.
    next: usize,
}

impl PortPool {
    /// A pool of at most `capacity` ports whose first search starts at `start` (a random port
    /// spreads tunnels' choices).
    pub fn starting_at(start: u16, capacity: usize) -> Self {
        let mut in_use = vec![0u64; WORDS];
        // the bits past the range's end in the last word never count as free
        let tail = WORDS * 64 - COUNT;
        if tail > 0 {
            if let Some(last) = in_use.last_mut() {
                *last = !0u64 << (64 - tail);
            }
        }
        Self {
            in_use,
            used: 0,
            capacity: capacity.min(COUNT),
            next: usize::from(start.clamp(FIRST, LAST) - FIRST),
        }
    }

    /// Ports in use.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used
    }

    /// A free port, now marked in use.
    pub fn allocate(&mut self) -> Result<u16, PortsExhausted> {
        if self.used >= self.capacity {
            return Err(PortsExhausted(self.capacity));
        }
        let mut index = self.next;
        // at most WORDS + 1 words are looked at: the pool has a free bit (checked above)
        for _ in 0..=WORDS {
            let word = index / 64;
            let bit = index % 64;
            // free bits of this word at or after `bit`
            let free = !self.in_use[word] & (!0u64 << bit);
            if free != 0 {
                let found = word * 64 + free.trailing_zeros() as usize;
                self.in_use[word] |= 1 << (found % 64);
                self.used += 1;
                self.next = (found + 1) % COUNT;
                // found < COUNT: bits past the range are marked used
                return Ok(FIRST + found as u16);
            }
            index = ((word + 1) * 64) % (WORDS * 64);
            if index >= COUNT {
                index = 0;
            }
        }
        Err(PortsExhausted(self.capacity))
    }

    /// Gives `port` back; ports outside the range or not in use are ignored.
    pub fn release(&mut self, port: u16) {
        if !(FIRST..=LAST).contains(&port) {
            return;
        }
        let index = usize::from(port - FIRST);
        let mask = 1u64 << (index % 64);
        let word = &mut self.in_use[index / 64];
        if *word & mask != 0 {
            *word &= !mask;
            self.used -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_port_once_then_exhausted_then_a_released_one() {
        let mut pool = PortPool::starting_at(60_000, COUNT);
        let mut seen = HashSet::new();
        for _ in 0..COUNT {
            let port = pool.allocate().expect("a free port");
            assert!((FIRST..=LAST).contains(&port), "{port}");
            assert!(seen.insert(port), "{port} handed out twice");
        }
        assert_eq!(pool.used(), COUNT);
        assert_eq!(pool.allocate(), Err(PortsExhausted(COUNT)));
        pool.release(50_000);
        assert_eq!(pool.allocate(), Ok(50_000));
        assert_eq!(pool.allocate(), Err(PortsExhausted(COUNT)));
    }

    #[test]
    fn a_released_port_is_not_reused_at_once() {
        let mut pool = PortPool::starting_at(FIRST, COUNT);
        let a = pool.allocate().expect("port");
        pool.release(a);
        let b = pool.allocate().expect("port");
        assert_ne!(a, b);
        assert_eq!(pool.used(), 1);
    }

    #[test]
    fn the_search_wraps_around_the_range_end() {
        let mut pool = PortPool::starting_at(LAST, COUNT);
        assert_eq!(pool.allocate(), Ok(LAST));
        assert_eq!(pool.allocate(), Ok(FIRST));
        pool.release(FIRST);
        pool.release(FIRST); // twice: ignored
        pool.release(80); // outside: ignored
        assert_eq!(pool.used(), 1);
    }

    #[test]
    fn a_smaller_pool_refuses_beyond_its_capacity() {
        let mut pool = PortPool::starting_at(FIRST, 3);
        let ports: Vec<u16> = (0..3).map(|_| pool.allocate().expect("port")).collect();
        assert_eq!(pool.allocate(), Err(PortsExhausted(3)));
        pool.release(ports[1]);
        assert!(pool.allocate().is_ok());
        assert_eq!(pool.allocate(), Err(PortsExhausted(3)));
    }
}
