# UDP impairment relay (the kernel here has no sch_netem): forwards the client's datagrams to
# UPSTREAM and the answers back, each after DELAY_MS and each dropped with probability LOSS
# (seeded, so runs are comparable). Prints its port.
# usage: python3 udp_impair.py UPSTREAM_IP UPSTREAM_PORT DELAY_MS LOSS [OUTAGE_FILE]
import heapq, random, select, socket, sys, time
import os
upstream = (sys.argv[1], int(sys.argv[2])); delay = float(sys.argv[3]) / 1000; loss = float(sys.argv[4])
# while this file exists every datagram is dropped (a network outage)
outage = sys.argv[5] if len(sys.argv) > 5 else None
front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); front.bind(("127.0.0.1", 0))
back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); back.bind(("127.0.0.1", 0))
for s in (front, back):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
print(front.getsockname()[1], flush=True)
rnd = random.Random(7); queue = []; seq = 0; client = None
while True:
    wait = max(0.0, queue[0][0] - time.time()) if queue else 0.5
    ready, _, _ = select.select([front, back], [], [], wait)
    now = time.time()
    for sock in ready:
        data, addr = sock.recvfrom(65535)
        if rnd.random() < loss or (outage and os.path.exists(outage)):
            continue
        seq += 1
        if sock is front:
            client = addr
            heapq.heappush(queue, (now + delay, seq, back, data, upstream))
        elif client is not None:
            heapq.heappush(queue, (now + delay, seq, front, data, client))
    while queue and queue[0][0] <= time.time():
        _, _, sock, data, addr = heapq.heappop(queue)
        sock.sendto(data, addr)
