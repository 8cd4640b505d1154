# TCP relay that delays every chunk (up to 256 KiB) by DELAY_MS each way: the TCP twin of
# udp_impair.py for the same RTT on a CONNECT leg. Prints its port.
# usage: python3 tcp_delay.py UPSTREAM_IP UPSTREAM_PORT DELAY_MS
import socket, sys, threading, time, queue
upstream = (sys.argv[1], int(sys.argv[2])); delay = float(sys.argv[3]) / 1000
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(256); print(srv.getsockname()[1], flush=True)
def pipe(a, b):
    q = queue.Queue()
    def reader():
        while True:
            try:
                d = a.recv(262144)
            except OSError:
                d = b""
            q.put((time.time() + delay, d))
            if not d:
                return
    def writer():
        while True:
            due, d = q.get()
            time.sleep(max(0.0, due - time.time()))
            if not d:
                try: b.shutdown(socket.SHUT_WR)
                except OSError: pass
                return
            try: b.sendall(d)
            except OSError: return
    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()
while True:
    c, _ = srv.accept()
    u = socket.create_connection(upstream)
    for s in (c, u): s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipe(c, u); pipe(u, c)
