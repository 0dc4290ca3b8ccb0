#include "wire/address.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

/* Reads PORT (decimal digits only, no sign or space) into *port. Returns 0 or a PAGODA_E*
 * code naming flag. */
static int parse_port(const char *flag, const char *address, const char *text, int *port)
{
    size_t n = strlen(text);
    if (n == 0 || n > 5 || strspn(text, "0123456789") != n)
        return pagoda_error_set(PAGODA_EINVAL,
                                "%s %s: the port must be a number (tcp://HOST:PORT, PORT 1..65535)",
                                flag, address);
    long v = 0;
    for (const char *p = text; *p != '\0'; p++)
        v = v * 10 + (*p - '0');
    if (v < 1 || v > 65535)
        return pagoda_error_set(PAGODA_ERANGE, "%s %s: port %ld is out of range (1..65535)", flag,
                                address, v);
    *port = (int)v;
    return 0;
}

/* Checks HOST of tcp://HOST:PORT: a bracketed IPv6 address, or letters, digits, '.', '-' and
 * '_' (names and IPv4 addresses), or "*". */
static int check_host(const char *flag, const char *address, const char *host, size_t len)
{
    if (len == 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "%s %s: the host is missing (tcp://HOST:PORT; 0.0.0.0 or * for "
                                "every interface)",
                                flag, address);
    if (host[0] == '[') {
        if (len < 3 || host[len - 1] != ']')
            return pagoda_error_set(PAGODA_EINVAL, "%s %s: an IPv6 host needs its closing ']'",
                                    flag, address);
        for (size_t i = 1; i + 1 < len; i++)
            if (strchr("0123456789abcdefABCDEF:.", host[i]) == NULL)
                return pagoda_error_set(PAGODA_EINVAL, "%s %s: '%c' in an IPv6 host", flag, address,
                                        host[i]);
        return 0;
    }
    if (len == 1 && host[0] == '*')
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = host[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_'))
            return pagoda_error_set(PAGODA_EINVAL,
                                    "%s %s: '%c' cannot be in a host name (an IPv6 address goes "
                                    "in brackets)",
                                    flag, address, c);
    }
    return 0;
}

/* Splits tcp://HOST:PORT at its last ':' (an IPv6 host holds colons inside its brackets).
 * Returns the port text, or NULL when there is no ':' after the host. */
static const char *tcp_port_text(const char *rest)
{
    const char *colon = strrchr(rest, ':');
    const char *bracket = strrchr(rest, ']');
    if (colon == NULL || (bracket != NULL && colon < bracket))
        return NULL;
    return colon + 1;
}

int wire_address_check(const char *flag, const char *address, enum wire_address_kind kind)
{
    if (address == NULL || address[0] == '\0')
        return pagoda_error_set(PAGODA_EINVAL, "%s: the address is empty", flag);
    size_t n = strlen(address);
    if (n > WIRE_ADDRESS_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "%s: the address is %zu bytes long; at most %d",
                                flag, n, WIRE_ADDRESS_MAX);
    if (strncmp(address, "ipc://", 6) == 0) {
        const char *path = address + 6;
        size_t len = strlen(path);
        if (len == 0)
            return pagoda_error_set(PAGODA_EINVAL, "%s %s: the socket path is missing", flag,
                                    address);
        if (len > WIRE_IPC_PATH_MAX)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "%s %s: the socket path is %zu bytes long; a Unix socket "
                                    "path holds at most %d",
                                    flag, address, len, WIRE_IPC_PATH_MAX);
        return 0;
    }
    if (strncmp(address, "tcp://", 6) == 0) {
        if (kind == WIRE_ADDRESS_IPC_ONLY)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "%s %s: this link must be ipc:// (its peer is on this host)",
                                    flag, address);
        const char *rest = address + 6;
        const char *port_text = tcp_port_text(rest);
        if (port_text == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "%s %s: the port is missing (tcp://HOST:PORT)",
                                    flag, address);
        int rc = check_host(flag, address, rest, (size_t)(port_text - 1 - rest));
        if (rc == 0 && kind == WIRE_ADDRESS_DIAL && wire_address_is_wildcard(address))
            return pagoda_error_set(PAGODA_EINVAL,
                                    "%s %s: this flag dials: give the peer's host (0.0.0.0, * and "
                                    "[::] only say where to listen)",
                                    flag, address);
        int port;
        if (rc == 0)
            rc = parse_port(flag, address, port_text, &port);
        return rc;
    }
    return pagoda_error_set(PAGODA_EINVAL, "%s %s: expected ipc://PATH%s", flag, address,
                            kind == WIRE_ADDRESS_IPC_ONLY ? "" : " or tcp://HOST:PORT");
}

int wire_address_port(const char *address)
{
    if (address == NULL || strncmp(address, "tcp://", 6) != 0)
        return -1;
    const char *port_text = tcp_port_text(address + 6);
    int port;
    if (port_text == NULL || parse_port("", address, port_text, &port) != 0) {
        pagoda_error_clear();
        return -1;
    }
    return port;
}

int wire_address_offset_port(char *buf, size_t len, const char *address, int offset)
{
    int port = wire_address_port(address);
    if (port < 0)
        return pagoda_error_set(PAGODA_EINVAL, "%s: not a tcp://HOST:PORT address",
                                address ? address : "(null)");
    if (offset < 0 || port + offset > 65535)
        return pagoda_error_set(PAGODA_ERANGE, "%s: port %d + %d passes 65535", address, port,
                                offset);
    const char *port_text = tcp_port_text(address + 6);
    int n = snprintf(buf, len, "%.*s%d", (int)(port_text - address), address, port + offset);
    if (n < 0 || (size_t)n >= len)
        return pagoda_error_set(PAGODA_ERANGE, "%s: the address does not fit %zu bytes", address,
                                len);
    return 0;
}

/* The listening hosts of every interface and the loopback host a peer on this host dials. */
static const struct {
    const char *any, *loopback;
} wildcard_hosts[] = {{"tcp://0.0.0.0:", "tcp://127.0.0.1:"},
                      {"tcp://*:", "tcp://127.0.0.1:"},
                      {"tcp://[::]:", "tcp://[::1]:"}};

int wire_address_is_wildcard(const char *address)
{
    for (size_t i = 0; address != NULL && i < sizeof(wildcard_hosts) / sizeof(wildcard_hosts[0]);
         i++)
        if (strncmp(address, wildcard_hosts[i].any, strlen(wildcard_hosts[i].any)) == 0)
            return 1;
    return 0;
}

int wire_address_dial_form(char *buf, size_t len, const char *address)
{
    int n = -1;
    for (size_t i = 0; i < sizeof(wildcard_hosts) / sizeof(wildcard_hosts[0]) && n < 0; i++) {
        size_t k = strlen(wildcard_hosts[i].any);
        if (strncmp(address, wildcard_hosts[i].any, k) == 0)
            n = snprintf(buf, len, "%s%s", wildcard_hosts[i].loopback, address + k);
    }
    if (n < 0)
        n = snprintf(buf, len, "%s", address);
    if (n < 0 || (size_t)n >= len)
        return pagoda_error_set(PAGODA_ERANGE, "%s: the address does not fit %zu bytes", address,
                                len);
    return 0;
}
