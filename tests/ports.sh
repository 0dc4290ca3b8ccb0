# Local TCP ports for the test scripts (source it): take_port VAR [N] sets VAR to the first of N
# (default 1) consecutive ports that are free now, below the kernel's ephemeral range
# (ip_local_port_range, 32768 by default). A port in that range can be any outgoing connection's
# local port (another test's clients), and a listen on it then fails with "Address in use"; a
# port the kernel hands out for bind(0) is such a port. The search starts in a block chosen by
# the script's pid, away from the default 7450, and moves on past each port taken, so one script
# never gets the same port twice.
# shellcheck shell=bash
ports_ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$ports_ephemeral" -ge 21024 ] 2>/dev/null || ports_ephemeral=32768
ports_next=$((20000 + ($$ * 16) % ((ports_ephemeral - 20000) / 16 * 16)))

port_free() { # port_free PORT: nothing listens on (or is bound to) 127.0.0.1:PORT
    python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$1" \
        2>/dev/null
}

take_port() { # take_port VAR [N]
    local n=${2:-1} p i ok
    for ((p = ports_next; p + n < ports_ephemeral; p++)); do
        ok=1
        for ((i = 0; i < n; i++)); do port_free $((p + i)) || { ok=0; break; }; done
        if [ $ok = 1 ]; then
            ports_next=$((p + n))
            printf -v "$1" '%s' "$p"
            return 0
        fi
    done
    echo "no $n free consecutive ports below $ports_ephemeral" >&2
    exit 1
}
