//! Round-robin core selection for a `SO_REUSEPORT` listener group (`reuseport_balance.bpf.c`):
//! the data plane's per-core listeners of one port get new connections in turn instead of by
//! the kernel's 4-tuple hash, so a few dozen keep-alive clients split evenly over the cores.

// aya's `Pod` marker for the map value mirrors the C struct
#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;

use aya::maps::{Array, MapData, ReusePortSockArray};
use aya::programs::SkReuseport;

use crate::{take_map, Error};

/// The compiled balancing object linked into the binary.
pub const REUSEPORT_BALANCE_OBJECT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/reuseport_balance.bpf.o"));

const PROGRAM: &str = "sy_select_core";
const LISTENERS: &str = "sy_listeners";
const TURN: &str = "sy_turn";
/// `MAX_CORES` in the C source: the size of `sy_listeners`.
pub const MAX_CORES: usize = 1024;

/// `struct turn` of the C source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Turn {
    cores: u32,
    next: u32,
}

// SAFETY: `Turn` is `#[repr(C)]` of two `u32`s: no padding, every bit pattern valid.
unsafe impl aya::Pod for Turn {}

/// The balancing program attached to one listener group, with the map of its sockets.
/// Dropping it leaves the program attached (the kernel holds it for the group until the last
/// socket closes); only [`ReuseportBalancer::replace`] needs this handle.
pub struct ReuseportBalancer {
    listeners: ReusePortSockArray<MapData>,
    // keeps the program's descriptor for as long as the maps are updated
    _ebpf: aya::Ebpf,
}

impl ReuseportBalancer {
    /// Loads the program, stores `sockets` (listening, `SO_REUSEPORT`, one group: socket `i` is
    /// core `i`'s) and attaches it to their group. Needs `CAP_BPF` (or `CAP_SYS_ADMIN`); on
    /// failure nothing is attached and the kernel's hash keeps choosing.
    pub fn attach(sockets: &[BorrowedFd<'_>]) -> Result<Self, Error> {
        if sockets.is_empty() || sockets.len() > MAX_CORES {
            return Err(Error::Cores(sockets.len()));
        }
        let mut ebpf = aya::EbpfLoader::new().load(REUSEPORT_BALANCE_OBJECT)?;
        let mut listeners: ReusePortSockArray<MapData> =
            ReusePortSockArray::try_from(take_map(&mut ebpf, LISTENERS)?)
                .map_err(|e| Error::Map(LISTENERS, e))?;
        let mut turn: Array<MapData, Turn> =
            Array::try_from(take_map(&mut ebpf, TURN)?).map_err(|e| Error::Map(TURN, e))?;
        for (index, socket) in (0u32..).zip(sockets) {
            listeners
                .set(index, socket, 0)
                .map_err(|e| Error::Map(LISTENERS, e))?;
        }
        let cores = u32::try_from(sockets.len()).map_err(|_| Error::Cores(sockets.len()))?;
        turn.set(0, Turn { cores, next: 0 }, 0)
            .map_err(|e| Error::Map(TURN, e))?;
        let program: &mut SkReuseport = ebpf
            .program_mut(PROGRAM)
            .ok_or(Error::Missing(PROGRAM))?
            .try_into()
            .map_err(|e| Error::Program(PROGRAM, e))?;
        program.load().map_err(|e| Error::Program(PROGRAM, e))?;
        let first = sockets.first().ok_or(Error::Cores(0))?;
        program
            .attach(first)
            .map_err(|e| Error::Program(PROGRAM, e))?;
        Ok(ReuseportBalancer {
            listeners,
            _ebpf: ebpf,
        })
    }

    /// Puts a restarted core's new listener at its index (the kernel removed the old one from
    /// the map when it closed; until then that core's turns fell back to the hash).
    pub fn replace(&mut self, index: usize, socket: BorrowedFd<'_>) -> Result<(), Error> {
        let index = u32::try_from(index).map_err(|_| Error::Cores(index))?;
        self.listeners
            .set(index, &socket, 0)
            .map_err(|e| Error::Map(LISTENERS, e))
    }
}
