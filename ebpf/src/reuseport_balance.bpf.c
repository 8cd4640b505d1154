// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// Round-robin selection of the data-plane core for each new connection to a listener group.
//
// Every data-plane core listens on its own SO_REUSEPORT socket of the same port; without a
// program the kernel picks one by a hash of the 4-tuple, which splits a few dozen long-lived
// connections unevenly (e.g. 40/24 on two cores), and the core with more connections answers
// each of them later. Attached to a group (SO_ATTACH_REUSEPORT_EBPF), this program hands new
// connections to the group's sockets in turn: `sy_listeners` holds the socket of core i at index
// i, `sy_turn` the number of cores and the next turn. Loaded once per listener group (a selected
// socket must belong to the group the connection arrived on). The Rust side
// (ebpf/src/reuseport.rs) mirrors `struct turn`.
//
// The turn counter is updated without an atomic: two SYNs handled at the same instant on two
// CPUs may take the same turn, which only puts one connection on a neighbouring core. When the
// selected index holds no socket (a core being restarted), the program selects nothing and the
// kernel falls back to its hash.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define MAX_CORES 1024

struct turn {
	__u32 cores; // sockets in sy_listeners (0: leave the choice to the kernel's hash)
	__u32 next;  // the next connection's turn
};

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__uint(max_entries, MAX_CORES);
	__type(key, __u32);
	__type(value, __u32);
} sy_listeners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct turn);
} sy_turn SEC(".maps");

SEC("sk_reuseport")
int sy_select_core(struct sk_reuseport_md *md)
{
	__u32 zero = 0;
	struct turn *turn = bpf_map_lookup_elem(&sy_turn, &zero);
	if (!turn || turn->cores == 0)
		return SK_PASS;
	__u32 n = turn->next;
	turn->next = n + 1;
	__u32 index = n % turn->cores;
	// on failure (no socket at index) nothing is selected: the kernel's hash decides
	bpf_sk_select_reuseport(md, &sy_listeners, &index, 0);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
