// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// Split-tunnel classification and DNS interception for `switchyard client`.
//
// Attached to the client's scope cgroup (and so to every cgroup below it):
//   cgroup/sock_create        first mark of a new socket, by the app cgroup it is created in
//   cgroup/connect4|6         re-mark by destination (LPM tries), redirect TCP/UDP :53, and
//                             redirect tunnelled TCP to the data plane's loopback listener
//   cgroup/sendmsg4|6         the same for unconnected UDP
//   cgroup/recvmsg4|6         replies of a redirected query appear to come from the original server
//   cgroup/getpeername4|6     a redirected connected socket reports the original peer
//   sockops                   at the SYN of a redirected TCP socket, records its original
//                             destination by the socket's local address and port: what the
//                             listener sees as the peer (sy_tcp_flows, read by the data plane)
//
// and to the scheduler's BTF tracepoints, which follow apps matched by name or path from the exec
// of their image (so a process started at any time is classified from its first socket, not after
// the client's next /proc scan moved it into the apps cgroup):
//   tp_btf/sched_process_exec  records the process (tgid) when its new image's comm or filename
//                              matches a rule (sy_app_names / sy_app_paths), forgets it otherwise
//   tp_btf/sched_process_fork  a new process inherits its parent's record (apps forking helpers)
//   tp_btf/sched_process_exit  the record goes when the last thread of the process exits
//
// A marked socket carries `tunnel_mark`; `ip rule fwmark <mark> lookup <table>` sends it into the
// TUN table. With `tcp_redirect4|6_port` set, a tunnelled TCP connect() of that family instead goes
// straight to the data plane's listener on loopback (no TUN, no per-segment rewriting), unmarked.
// A socket that already carries any other mark (the proxy's own sockets set SO_MARK) or
// lives in a cgroup listed as BYPASS is never touched. Maps are pinned by name so the loader can find
// and remove them after a crash. The Rust side (ebpf/src/maps.rs) mirrors every struct here.
//
// cgroup hooks see every socket created in the cgroup tree, whatever its network namespace
// (containers, `ip netns exec`, other VPNs share the tree): each program first checks the socket's
// netns cookie against the client's (`config.netns_cookie`) and leaves a socket of any other
// namespace exactly as it is. bpf_get_netns_cookie is available to cgroup/sock_create
// (BPF_PROG_TYPE_CGROUP_SOCK) and to the cgroup/*4|6 programs (BPF_PROG_TYPE_CGROUP_SOCK_ADDR)
// since Linux 5.7.

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#ifndef SOL_SOCKET
#define SOL_SOCKET 1
#endif
#ifndef SO_MARK
#define SO_MARK 36
#endif
#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

#define MODE_EXCLUDE 0 // everything in scope is tunnelled except matches
#define MODE_INCLUDE 1 // only matches are tunnelled

#define APP_SELECTED 1 // cgroup of an app named by the split rules
#define APP_BYPASS 2   // cgroup never classified (the client itself)

#define FLAG_DNS4 1 // redirect IPv4 :dns_port to resolver4
#define FLAG_DNS6 2 // redirect IPv6 :dns_port to resolver6

struct config {
	__u32 mode;
	__u32 tunnel_mark;
	__u32 flags;
	__u32 resolver4;        // network order
	__u32 resolver6[4];     // network order
	__u16 resolver4_port;   // network order
	__u16 resolver6_port;   // network order
	__u16 dns_port;         // network order
	__u16 _pad;
	__u64 netns_cookie;     // the client's network namespace; 0 never matches
	__u16 tcp_redirect4_port; // network order; 0: tunnelled IPv4 TCP keeps the TUN path
	__u16 tcp_redirect6_port; // network order; 0: tunnelled IPv6 TCP keeps the TUN path
	__u32 _pad2;
};

struct lpm_v4 {
	__u32 prefixlen;
	__u32 addr;
};

struct lpm_v6 {
	__u32 prefixlen;
	__u32 addr[4];
};

// Original destination of a redirected DNS or TCP socket, keyed by socket cookie.
struct orig_dst {
	__u32 addr[4]; // v4 in addr[0]
	__u16 port;
	__u16 family;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_config SEC(".maps");

// Destinations named by the rules (`ips` and domain-derived addresses).
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct lpm_v4);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_split_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct lpm_v6);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_split_v6 SEC(".maps");

// `always_bypass`: never tunnelled, whatever the mode.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__type(key, struct lpm_v4);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_bypass_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__type(key, struct lpm_v6);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_bypass_v6 SEC(".maps");

// cgroup id -> APP_SELECTED | APP_BYPASS
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_app_cgroups SEC(".maps");

#define COMM_LEN 16  // TASK_COMM_LEN: 15 bytes and a NUL, as /proc/PID/comm
#define PATH_LEN 256 // longer rule paths are matched by the /proc scan only

// Name rules: comm (zero-padded, cut at 15 bytes) -> 1
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, char[COMM_LEN]);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_app_names SEC(".maps");

// Path rules: absolute executable path (zero-padded) -> 1
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, char[PATH_LEN]);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_app_paths SEC(".maps");

// tgid of a process whose image matched a name/path rule -> APP_SELECTED
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_app_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct orig_dst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_dns_orig SEC(".maps");

// Original destination of a TCP socket redirected to the data plane's listener, by socket cookie
// (getpeername, and the sockops program). LRU: entries of closed sockets age out.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct orig_dst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_tcp_orig SEC(".maps");

// The connecting socket's local address (IPv6; IPv4 as ::ffff:a.b.c.d) and port (host order): the
// peer the listener accepts.
struct flow_key {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

// Original destination of a redirected TCP connection by its client's address, taken (looked up
// and deleted) by the data plane on accept. LRU: entries of connections that never reached the
// listener age out.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct orig_dst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sy_tcp_flows SEC(".maps");

static __always_inline struct config *lookup_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sy_config, &zero);
}

// The config when the socket of `ctx` (a program's context) lives in the client's network
// namespace, else 0: every program then returns "allow" without touching the socket.
static __always_inline struct config *get_config(void *ctx)
{
	struct config *cfg = lookup_config();
	if (!cfg || cfg->netns_cookie == 0 || bpf_get_netns_cookie(ctx) != cfg->netns_cookie)
		return 0;
	return cfg;
}

// The class of the current process: its cgroup's (a bypass cgroup wins), else its own record
// from the exec hook.
static __always_inline __u32 app_class(void)
{
	__u64 cg = bpf_get_current_cgroup_id();
	__u32 *class = bpf_map_lookup_elem(&sy_app_cgroups, &cg);
	if (class && *class)
		return *class;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	class = bpf_map_lookup_elem(&sy_app_tgids, &tgid);
	return class ? *class : 0;
}

// Whether a socket of this app class to a destination with these LPM hits is tunnelled.
static __always_inline int wants_tunnel(const struct config *cfg, __u32 class, int split_hit,
					int bypass_hit)
{
	if (bypass_hit)
		return 0;
	int matched = class == APP_SELECTED || split_hit;
	return cfg->mode == MODE_INCLUDE ? matched : !matched;
}

// Sets or clears the tunnel mark; leaves a foreign mark (the proxy's own) alone.
static __always_inline void apply_mark(struct bpf_sock_addr *ctx, const struct config *cfg,
				       int tunnel)
{
	int mark = 0;
	if (bpf_getsockopt(ctx, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)))
		return;
	if (mark != 0 && (__u32)mark != cfg->tunnel_mark)
		return;
	int want = tunnel ? (int)cfg->tunnel_mark : 0;
	if (want != mark)
		bpf_setsockopt(ctx, SOL_SOCKET, SO_MARK, &want, sizeof(want));
}

static __always_inline int has_foreign_mark(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	int mark = 0;
	if (bpf_getsockopt(ctx, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)))
		return 0;
	return mark != 0 && (__u32)mark != cfg->tunnel_mark;
}

// The config when this socket is to be classified at all: TCP or UDP, not in a bypass cgroup, no
// foreign mark. Stores the app class of the current cgroup in *class.
static __always_inline struct config *classified(struct bpf_sock_addr *ctx, __u32 *class)
{
	struct config *cfg = get_config(ctx);
	if (!cfg)
		return 0;
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 0;
	*class = app_class();
	if (*class == APP_BYPASS || has_foreign_mark(ctx, cfg))
		return 0;
	return cfg;
}

// A socket bound to a device (SO_BINDTODEVICE) cannot reach loopback: it keeps the TUN path.
static __always_inline int bound_to_device(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	return !sk || sk->bound_dev_if != 0;
}

// Remembers where the TCP socket of `ctx` was going, for getpeername and the sockops program.
// False when it could not be stored: the connection then keeps the TUN path.
static __always_inline int remember_tcp_orig(struct bpf_sock_addr *ctx, const struct orig_dst *orig)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	return bpf_map_update_elem(&sy_tcp_orig, &cookie, orig, BPF_ANY) == 0;
}

static __always_inline int is_v4_mapped(const __u32 addr[4])
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

#define LOOPBACK4 0x7f000001 // 127.0.0.1, host order

// The destination connect4/sendmsg4 were given.
static __always_inline void orig_of4(struct bpf_sock_addr *ctx, struct orig_dst *orig)
{
	orig->addr[0] = ctx->user_ip4;
	orig->port = (__u16)ctx->user_port;
	orig->family = AF_INET;
}

// The destination connect6/sendmsg6 were given.
static __always_inline void orig_of6(struct bpf_sock_addr *ctx, struct orig_dst *orig)
{
	orig->addr[0] = ctx->user_ip6[0];
	orig->addr[1] = ctx->user_ip6[1];
	orig->addr[2] = ctx->user_ip6[2];
	orig->addr[3] = ctx->user_ip6[3];
	orig->port = (__u16)ctx->user_port;
	orig->family = AF_INET6;
}

SEC("cgroup/sock_create")
int sy_sock_create(struct bpf_sock *sk)
{
	struct config *cfg = get_config(sk);
	if (!cfg || sk->mark != 0)
		return 1;
	if (sk->family != AF_INET && sk->family != AF_INET6)
		return 1;
	__u32 class = app_class();
	if (class == APP_BYPASS)
		return 1;
	if (wants_tunnel(cfg, class, 0, 0))
		sk->mark = cfg->tunnel_mark;
	return 1;
}

// ---- IPv4 ----

static __always_inline int redirect_dns4(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	if (!(cfg->flags & FLAG_DNS4) || ctx->user_port != cfg->dns_port)
		return 0;
	if (ctx->user_ip4 == cfg->resolver4 && ctx->user_port == cfg->resolver4_port)
		return 0;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct orig_dst orig = {};
	orig_of4(ctx, &orig);
	bpf_map_update_elem(&sy_dns_orig, &cookie, &orig, BPF_ANY);
	ctx->user_ip4 = cfg->resolver4;
	ctx->user_port = cfg->resolver4_port;
	return 1;
}

// A tunnelled TCP connect() goes to 127.0.0.1:tcp_redirect4_port instead; true when redirected.
static __always_inline int redirect_tcp4(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	if (ctx->protocol != IPPROTO_TCP || cfg->tcp_redirect4_port == 0 || bound_to_device(ctx))
		return 0;
	// a loopback destination is never redirected: among others the target of an older
	// instance of these programs that ran first (a lockdown takeover attaches the new
	// programs beside the old ones before removing those)
	if ((bpf_ntohl(ctx->user_ip4) >> 24) == 127)
		return 0;
	struct orig_dst orig = {};
	orig_of4(ctx, &orig);
	if (!remember_tcp_orig(ctx, &orig))
		return 0;
	ctx->user_ip4 = bpf_htonl(LOOPBACK4);
	ctx->user_port = cfg->tcp_redirect4_port;
	return 1;
}

// `connect`: connect4 (TCP may be redirected), else sendmsg4 (UDP only).
static __always_inline int classify4(struct bpf_sock_addr *ctx, int connect)
{
	__u32 class = 0;
	struct config *cfg = classified(ctx, &class);
	if (!cfg)
		return 1;
	if (redirect_dns4(ctx, cfg))
		return 1;
	struct lpm_v4 key = { .prefixlen = 32, .addr = ctx->user_ip4 };
	int bypass_hit = bpf_map_lookup_elem(&sy_bypass_v4, &key) != 0;
	int split_hit = bpf_map_lookup_elem(&sy_split_v4, &key) != 0;
	int tunnel = wants_tunnel(cfg, class, split_hit, bypass_hit);
	// loopback must not be routed into the TUN: a redirected socket loses the tunnel mark
	if (tunnel && connect && redirect_tcp4(ctx, cfg))
		tunnel = 0;
	apply_mark(ctx, cfg, tunnel);
	return 1;
}

SEC("cgroup/connect4")
int sy_connect4(struct bpf_sock_addr *ctx)
{
	return classify4(ctx, 1);
}

SEC("cgroup/sendmsg4")
int sy_sendmsg4(struct bpf_sock_addr *ctx)
{
	return classify4(ctx, 0);
}

// Puts back the original IPv4 peer of the socket when `orig_map` has one; true when done.
static __always_inline int restore_orig4(struct bpf_sock_addr *ctx, void *orig_map)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct orig_dst *orig = bpf_map_lookup_elem(orig_map, &cookie);
	if (!orig || orig->family != AF_INET)
		return 0;
	ctx->user_ip4 = orig->addr[0];
	ctx->user_port = orig->port;
	return 1;
}

static __always_inline void restore_dns_peer4(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	if (!(cfg->flags & FLAG_DNS4))
		return;
	if (ctx->user_ip4 != cfg->resolver4 || ctx->user_port != cfg->resolver4_port)
		return;
	restore_orig4(ctx, &sy_dns_orig);
}

SEC("cgroup/recvmsg4")
int sy_recvmsg4(struct bpf_sock_addr *ctx)
{
	struct config *cfg = get_config(ctx);
	if (cfg)
		restore_dns_peer4(ctx, cfg);
	return 1;
}

SEC("cgroup/getpeername4")
int sy_getpeername4(struct bpf_sock_addr *ctx)
{
	struct config *cfg = get_config(ctx);
	if (!cfg)
		return 1;
	// a TCP socket redirected to the listener (the peer is the redirect target)
	if (cfg->tcp_redirect4_port != 0 && ctx->user_port == cfg->tcp_redirect4_port &&
	    ctx->user_ip4 == bpf_htonl(LOOPBACK4) && restore_orig4(ctx, &sy_tcp_orig))
		return 1;
	restore_dns_peer4(ctx, cfg);
	return 1;
}

// ---- IPv6 ----

static __always_inline int redirect_dns6(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	if (!(cfg->flags & FLAG_DNS6) || ctx->user_port != cfg->dns_port)
		return 0;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct orig_dst orig = {};
	orig_of6(ctx, &orig);
	bpf_map_update_elem(&sy_dns_orig, &cookie, &orig, BPF_ANY);
	ctx->user_ip6[0] = cfg->resolver6[0];
	ctx->user_ip6[1] = cfg->resolver6[1];
	ctx->user_ip6[2] = cfg->resolver6[2];
	ctx->user_ip6[3] = cfg->resolver6[3];
	ctx->user_port = cfg->resolver6_port;
	return 1;
}

// A tunnelled TCP connect() goes to [::1]:tcp_redirect6_port, or for a v4-mapped destination (a
// dual-stack socket) to ::ffff:127.0.0.1:tcp_redirect4_port; true when redirected.
static __always_inline int redirect_tcp6(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	if (ctx->protocol != IPPROTO_TCP)
		return 0;
	struct orig_dst orig = {};
	orig_of6(ctx, &orig);
	int mapped = is_v4_mapped(orig.addr);
	// loopback (::1, ::ffff:127.0.0.0/104) is never redirected, as in redirect_tcp4
	if (mapped ? (bpf_ntohl(orig.addr[3]) >> 24) == 127
		   : (orig.addr[0] | orig.addr[1] | orig.addr[2]) == 0 && orig.addr[3] == bpf_htonl(1))
		return 0;
	__u16 port = mapped ? cfg->tcp_redirect4_port : cfg->tcp_redirect6_port;
	if (port == 0 || bound_to_device(ctx) || !remember_tcp_orig(ctx, &orig))
		return 0;
	ctx->user_ip6[0] = 0;
	ctx->user_ip6[1] = 0;
	ctx->user_ip6[2] = mapped ? bpf_htonl(0xffff) : 0;
	ctx->user_ip6[3] = mapped ? bpf_htonl(LOOPBACK4) : bpf_htonl(1);
	ctx->user_port = port;
	return 1;
}

// `connect`: connect6 (TCP may be redirected), else sendmsg6 (UDP only).
static __always_inline int classify6(struct bpf_sock_addr *ctx, int connect)
{
	__u32 class = 0;
	struct config *cfg = classified(ctx, &class);
	if (!cfg)
		return 1;
	if (redirect_dns6(ctx, cfg))
		return 1;
	struct lpm_v6 key = { .prefixlen = 128 };
	key.addr[0] = ctx->user_ip6[0];
	key.addr[1] = ctx->user_ip6[1];
	key.addr[2] = ctx->user_ip6[2];
	key.addr[3] = ctx->user_ip6[3];
	int bypass_hit = bpf_map_lookup_elem(&sy_bypass_v6, &key) != 0;
	int split_hit = bpf_map_lookup_elem(&sy_split_v6, &key) != 0;
	int tunnel = wants_tunnel(cfg, class, split_hit, bypass_hit);
	// loopback must not be routed into the TUN: a redirected socket loses the tunnel mark
	if (tunnel && connect && redirect_tcp6(ctx, cfg))
		tunnel = 0;
	apply_mark(ctx, cfg, tunnel);
	return 1;
}

SEC("cgroup/connect6")
int sy_connect6(struct bpf_sock_addr *ctx)
{
	return classify6(ctx, 1);
}

SEC("cgroup/sendmsg6")
int sy_sendmsg6(struct bpf_sock_addr *ctx)
{
	return classify6(ctx, 0);
}

// Puts back the original IPv6 peer of the socket when `orig_map` has one; true when done.
static __always_inline int restore_orig6(struct bpf_sock_addr *ctx, void *orig_map)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct orig_dst *orig = bpf_map_lookup_elem(orig_map, &cookie);
	if (!orig || orig->family != AF_INET6)
		return 0;
	ctx->user_ip6[0] = orig->addr[0];
	ctx->user_ip6[1] = orig->addr[1];
	ctx->user_ip6[2] = orig->addr[2];
	ctx->user_ip6[3] = orig->addr[3];
	ctx->user_port = orig->port;
	return 1;
}

static __always_inline void restore_dns_peer6(struct bpf_sock_addr *ctx, const struct config *cfg)
{
	if (!(cfg->flags & FLAG_DNS6) || ctx->user_port != cfg->resolver6_port)
		return;
	if (ctx->user_ip6[0] != cfg->resolver6[0] || ctx->user_ip6[1] != cfg->resolver6[1] ||
	    ctx->user_ip6[2] != cfg->resolver6[2] || ctx->user_ip6[3] != cfg->resolver6[3])
		return;
	restore_orig6(ctx, &sy_dns_orig);
}

// Whether the peer of `ctx` is a TCP redirect target: [::1]:tcp_redirect6_port or
// ::ffff:127.0.0.1:tcp_redirect4_port.
static __always_inline int is_tcp_redirect_target6(struct bpf_sock_addr *ctx,
						   const struct config *cfg)
{
	if (ctx->user_ip6[0] != 0 || ctx->user_ip6[1] != 0)
		return 0;
	__u32 word2 = ctx->user_ip6[2];
	__u32 word3 = ctx->user_ip6[3];
	__u32 port = ctx->user_port;
	if (word2 == 0 && word3 == bpf_htonl(1))
		return cfg->tcp_redirect6_port != 0 && port == cfg->tcp_redirect6_port;
	if (word2 == bpf_htonl(0xffff) && word3 == bpf_htonl(LOOPBACK4))
		return cfg->tcp_redirect4_port != 0 && port == cfg->tcp_redirect4_port;
	return 0;
}

SEC("cgroup/recvmsg6")
int sy_recvmsg6(struct bpf_sock_addr *ctx)
{
	struct config *cfg = get_config(ctx);
	if (cfg)
		restore_dns_peer6(ctx, cfg);
	return 1;
}

SEC("cgroup/getpeername6")
int sy_getpeername6(struct bpf_sock_addr *ctx)
{
	struct config *cfg = get_config(ctx);
	if (!cfg)
		return 1;
	if (is_tcp_redirect_target6(ctx, cfg) && restore_orig6(ctx, &sy_tcp_orig))
		return 1;
	restore_dns_peer6(ctx, cfg);
	return 1;
}

// ---- redirected TCP: the listener's view ----

SEC("sockops")
int sy_tcp_connect(struct bpf_sock_ops *skops)
{
	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB)
		return 1;
	// only sockets redirected by connect4|6 (of the client's namespace) have a record
	__u64 cookie = bpf_get_socket_cookie(skops);
	struct orig_dst *orig = bpf_map_lookup_elem(&sy_tcp_orig, &cookie);
	if (!orig)
		return 1;
	struct orig_dst value = *orig;
	// every field read up front, each at its fixed context offset (the verifier refuses a load
	// through a context pointer the compiler offset in a branch)
	__u32 local4 = skops->local_ip4;
	__u32 local6[4] = { skops->local_ip6[0], skops->local_ip6[1], skops->local_ip6[2],
			    skops->local_ip6[3] };
	__u32 local_port = skops->local_port; // host order
	struct flow_key key = {};
	if (value.family == AF_INET6 && !is_v4_mapped(value.addr)) {
		key.addr[0] = local6[0];
		key.addr[1] = local6[1];
		key.addr[2] = local6[2];
		key.addr[3] = local6[3];
	} else {
		// an IPv4 socket, or a dual-stack one connected to ::ffff:127.0.0.1: the listener sees
		// the IPv4 source, looked up as ::ffff:a.b.c.d
		key.addr[2] = bpf_htonl(0xffff);
		key.addr[3] = local4;
	}
	key.port = (__u16)local_port;
	bpf_map_update_elem(&sy_tcp_flows, &key, &value, BPF_ANY);
	return 1;
}

// ---- apps by name or path, from exec ----
//
// The kernel structs are read through BTF (CO-RE: the loader relocates each field to this kernel's
// layout), declared here with only the fields used.

struct net {
	__u64 net_cookie;
} __attribute__((preserve_access_index));

struct nsproxy {
	struct net *net_ns;
} __attribute__((preserve_access_index));

typedef struct {
	int counter;
} sy_atomic_t;

struct signal_struct {
	sy_atomic_t live;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct nsproxy *nsproxy;
	struct signal_struct *signal;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

static __always_inline int image_matches(struct linux_binprm *bprm)
{
	char comm[COMM_LEN] = {};
	// after exec the comm is the new image's base name
	bpf_get_current_comm(comm, sizeof(comm));
	if (bpf_map_lookup_elem(&sy_app_names, comm))
		return 1;
	char path[PATH_LEN] = {};
	if (bpf_probe_read_kernel_str(path, sizeof(path), bprm->filename) <= 0)
		return 0;
	return bpf_map_lookup_elem(&sy_app_paths, path) != 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sy_app_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct config *cfg = lookup_config();
	// only processes of the client's network namespace (the socket programs check each socket's
	// namespace again)
	if (cfg && cfg->netns_cookie != 0 && p->nsproxy &&
	    p->nsproxy->net_ns->net_cookie == cfg->netns_cookie && image_matches(bprm)) {
		__u32 selected = APP_SELECTED;
		bpf_map_update_elem(&sy_app_tgids, &tgid, &selected, BPF_ANY);
	} else {
		// a recorded app that exec'd another image is no longer that app
		bpf_map_delete_elem(&sy_app_tgids, &tgid);
	}
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sy_app_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 parent_tgid = parent->tgid;
	__u32 child_tgid = child->tgid;
	if (child_tgid == parent_tgid)
		return 0; // a new thread of the same process
	__u32 *class = bpf_map_lookup_elem(&sy_app_tgids, &parent_tgid);
	if (class) {
		__u32 value = *class;
		bpf_map_update_elem(&sy_app_tgids, &child_tgid, &value, BPF_ANY);
	} else {
		// a record left for a reused pid (its exit was missed) must not classify the new process
		bpf_map_delete_elem(&sy_app_tgids, &child_tgid);
	}
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sy_app_exit, struct task_struct *p)
{
	// do_exit counts the thread out of signal->live before this tracepoint: 0 = last thread
	if (p->signal && p->signal->live.counter == 0) {
		__u32 tgid = p->tgid;
		bpf_map_delete_elem(&sy_app_tgids, &tgid);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
