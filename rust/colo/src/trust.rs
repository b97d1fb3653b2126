//! Who may use a colo connection (spec/WIRE.md sections 2 and 3; docs/ARCHITECTURE.md, "Trust
//! comes from the admitted connection"). Trust is taken from what the kernel says about the TCP
//! sockets and about the peer of a Unix socket (`SO_PEERCRED`), never from a name alone:
//!
//! - a client trusts a rendezvous only if it belongs to the TCP listener the kernel would hand
//!   its connection to ([`rendezvous_trusted`]);
//! - a listener takes a DIRECT connection (no TCP handshake, so no firewall, cgroup BPF or
//!   Landlock rule sees it) only from a client of its own uid unless it opted in
//!   ([`direct_admitted`]), and only for an address its TCP socket serves ([`serves`]);
//! - a listener claims a CARRIER offer only from the owner of the offered TCP connection's
//!   client end ([`offer_sender_trusted`]).

use crate::options::Options;
use crate::wire;
use colo_sys::host;
use std::net::{IpAddr, SocketAddr};

/// The client's peer check (spec/WIRE.md section 2): the rendezvous `reached` (a name of the
/// lookup for `dialed`), whose server has uid `server_uid`, is trusted if that uid is ours or
/// root's (either could read our memory anyway), or if it is the rendezvous of the TCP listener
/// the kernel would give a connection to `dialed` and that listener is owned by `server_uid`.
/// `Err` says why not, for the log. Asks the kernel for its listeners only for a server of
/// another uid.
pub(crate) fn rendezvous_trusted(dialed: SocketAddr, reached: &str, server_uid: u32) -> Result<(), Untrusted> {
    if server_uid == host::uid() || server_uid == 0 {
        return Ok(());
    }
    check_rendezvous(dialed, reached, server_uid, &host::tcp_listeners())
}

/// Why a rendezvous is not trusted (for the log), and, when all that is wrong is its name (the
/// TCP listener the kernel would give the connection to uses another: someone else bound this
/// one), that listener's own name.
#[derive(Debug)]
pub(crate) struct Untrusted {
    pub(crate) why: String,
    pub(crate) own: Option<String>,
}

impl From<String> for Untrusted {
    fn from(why: String) -> Self {
        Untrusted { why, own: None }
    }
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

fn check_rendezvous(dialed: SocketAddr, reached: &str, server_uid: u32, sockets: &[host::TcpSocket]) -> Result<(), Untrusted> {
    let Some(listener) = host::kernel_listener(dialed, sockets) else {
        return Err(format!("rendezvous {reached} owned by uid {server_uid}, but no TCP socket listens for {dialed}").into());
    };
    let at_addr = || sockets.iter().filter(|s| s.listening && s.local == listener.addr);
    // An IPv6 wildcard listener that is IPV6_V6ONLY takes no IPv4 connection (TCP to `dialed`
    // is refused): a server of another uid could answer WELCOME where TCP says no one listens.
    // So an IPv4 dial trusts such a listener only where the kernel says none there is
    // (`sock_diag`; `/proc/net/tcp6` does not say), or if it is our uid or root's (above).
    if host::canonical(dialed.ip()).is_ipv4() && listener.addr.is_ipv6() && !at_addr().all(|s| s.v6only == Some(false)) {
        return Err(format!(
            "rendezvous {reached} owned by uid {server_uid}: {dialed} would go to the IPv6 wildcard {}, which is IPV6_V6ONLY or not known not to be (then TCP is refused)",
            listener.addr
        )
        .into());
    }
    // A listener bound to a device (SO_BINDTODEVICE, open to any user) takes no connection
    // that comes in on another one, loopback's among them: TCP to `dialed` may be refused while
    // the table lists it. Trusted only where the kernel says no socket there is so bound.
    if !at_addr().all(|s| s.device == Some(false)) {
        return Err(format!(
            "rendezvous {reached} owned by uid {server_uid}: the TCP listener on {} is bound to a network device, or the kernel's table does not say",
            listener.addr
        )
        .into());
    }
    let own = wire::rendezvous_name(listener.addr);
    if own != reached {
        let why = format!("rendezvous {reached} owned by uid {server_uid}, but {dialed} is served by the TCP listener on {} ({own})", listener.addr);
        return Err(Untrusted { why, own: Some(own) });
    }
    match listener.uid {
        Some(uid) if uid == server_uid => Ok(()),
        Some(uid) => Err(format!("rendezvous owned by uid {server_uid}, its TCP listener {} by uid {uid}", listener.addr).into()),
        None => Err(format!("rendezvous owned by uid {server_uid}, its TCP listener {} by several uids", listener.addr).into()),
    }
}

/// Whether a listener with options `opts` takes a DIRECT connection from a client of uid
/// `client_uid`: only from its own uid, unless it opted in ([`Options::direct_from_any_uid`],
/// asked only for another uid). Anyone else is told NEED_CARRIER and comes back with a CARRIER
/// offer, whose real TCP handshake the kernel's policy admits or not.
pub(crate) fn direct_admitted(client_uid: u32, opts: &Options) -> bool {
    client_uid == host::uid() || opts.direct_any_uid()
}

/// Whether a listener whose TCP socket is bound to `listen` (`v6only`: an IPv6 socket with
/// `IPV6_V6ONLY`) takes TCP connections to `dialed`, the address a DIRECT client says it
/// dialed (`None`: it did not say; taken as the listener's own address unless `v6only`, whose
/// refusal of IPv4 can then not be honoured).
pub(crate) fn serves(listen: SocketAddr, v6only: bool, dialed: Option<SocketAddr>) -> bool {
    let Some(dialed) = dialed else { return !v6only };
    let (l, d) = (host::canonical(listen.ip()), host::canonical(dialed.ip()));
    if dialed.port() != listen.port() {
        return false;
    }
    match l {
        IpAddr::V6(v6) if v6.is_unspecified() => d.is_ipv6() || !v6only,
        IpAddr::V4(v4) if v4.is_unspecified() => d.is_ipv4(),
        _ => l == d,
    }
}

/// `claim()`'s check of a CARRIER offer for the TCP connection `client` → `server` (spec/WIRE.md
/// section 3): its sender, of uid `sender_uid` (`SO_PEERCRED` of the control socket), must own
/// the client end of that connection, unless it is our uid or root (who could take the
/// connection anyway). Otherwise a user who read a 4-tuple in `/proc/net/tcp` could offer a
/// segment for a third party's connection and receive what that client sends. Asks the kernel
/// (one `sock_diag` lookup) only for a sender of another uid.
pub(crate) fn offer_sender_trusted(client: SocketAddr, server: SocketAddr, sender_uid: u32) -> Result<(), String> {
    if sender_uid == host::uid() || sender_uid == 0 {
        return Ok(());
    }
    match host::connection_owner(client, server) {
        Some(uid) if uid == sender_uid => Ok(()),
        Some(uid) => Err(format!("offer from uid {sender_uid} for {client} -> {server}, a connection of uid {uid}")),
        None => Err(format!("offer from uid {sender_uid} for {client} -> {server}, which it has no socket for")),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_rendezvous, serves};
    use colo_sys::host::parse_tcp_table;
    use std::net::SocketAddr;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// root (0) listens on 127.0.0.1:6391 and 0.0.0.0:7000; nobody (65534) on 127.0.0.2:6391
    /// (a decoy, listed first) and on [::]:7001.
    fn table() -> Vec<colo_sys::host::TcpSocket> {
        // As sock_diag reports them: bound to no device.
        let unbound = |t: Vec<colo_sys::host::TcpSocket>| t.into_iter().map(|s| colo_sys::host::TcpSocket { device: Some(false), ..s });
        let mut t: Vec<_> = unbound(parse_tcp_table(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0200007F:18F7 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1001
   1: 0100007F:18F7 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002
   2: 00000000:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003
",
        ))
        .collect();
        t.extend(unbound(parse_tcp_table(
            "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1B59 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 2001
",
        )));
        t
    }

    #[test]
    fn a_squatter_with_a_decoy_listener_on_the_port_is_refused() {
        let t = table();
        // A squatted exact name: the name of 127.0.0.1:6391, a decoy listener on 127.0.0.2.
        assert!(check_rendezvous(at("127.0.0.1:6391"), "colo/1/127.0.0.1:6391", 65534, &t).is_err());
        // The wildcard name for a port whose kernel listener is exact.
        assert!(check_rendezvous(at("127.0.0.1:6391"), "colo/1/0.0.0.0:6391", 65534, &t).is_err());
        // The exact name of an address served by root's wildcard: the wildcard's own name is
        // given, for the client to try next.
        let e = check_rendezvous(at("127.0.0.1:7000"), "colo/1/127.0.0.1:7000", 65534, &t).unwrap_err();
        assert_eq!(e.own.as_deref(), Some("colo/1/0.0.0.0:7000"));
        // The right name, the wrong uid: no other name to try.
        assert!(check_rendezvous(at("127.0.0.1:7000"), "colo/1/0.0.0.0:7000", 65534, &t).unwrap_err().own.is_none());
        // Nobody listens there at all.
        assert!(check_rendezvous(at("127.0.0.1:9"), "colo/1/127.0.0.1:9", 65534, &t).is_err());
    }

    #[test]
    fn the_owner_of_the_kernels_listener_is_trusted() {
        let t = table();
        assert!(check_rendezvous(at("127.0.0.2:6391"), "colo/1/127.0.0.2:6391", 65534, &t).is_ok());
        // An IPv4 dial that only an IPv6 wildcard of another uid would take: trusted only
        // where the kernel says that listener is not IPV6_V6ONLY (TCP refused).
        assert!(check_rendezvous(at("127.0.0.1:7001"), "colo/1/[::]:7001", 65534, &t).is_err(), "the table does not say");
        let with = |v6only| t.iter().map(|s| colo_sys::host::TcpSocket { v6only: if s.local.is_ipv6() { v6only } else { s.v6only }, ..*s }).collect::<Vec<_>>();
        assert!(check_rendezvous(at("127.0.0.1:7001"), "colo/1/[::]:7001", 65534, &with(Some(true))).is_err(), "IPV6_V6ONLY");
        assert!(check_rendezvous(at("127.0.0.1:7001"), "colo/1/[::]:7001", 65534, &with(Some(false))).is_ok(), "dual-stack");
        assert!(check_rendezvous(at("[::1]:7001"), "colo/1/[::]:7001", 65534, &t).is_ok());
        assert!(check_rendezvous(at("127.0.0.1:7001"), "colo/1/127.0.0.1:7001", 65534, &t).is_err());
    }

    #[test]
    fn a_listener_bound_to_a_device_or_not_known_to_be_unbound_proves_nothing() {
        use colo_sys::host::TcpSocket;
        let t: Vec<TcpSocket> = table().into_iter().map(|s| TcpSocket { device: Some(s.uid == 65534), ..s }).collect();
        assert!(check_rendezvous(at("127.0.0.2:6391"), "colo/1/127.0.0.2:6391", 65534, &t).is_err(), "bound to a device");
        let t: Vec<TcpSocket> = table().into_iter().map(|s| TcpSocket { device: None, ..s }).collect();
        assert!(check_rendezvous(at("127.0.0.2:6391"), "colo/1/127.0.0.2:6391", 65534, &t).is_err(), "/proc/net/tcp cannot say");
    }

    #[test]
    fn a_v6only_listener_serves_no_ipv4() {
        let any6 = at("[::]:80");
        assert!(serves(any6, false, Some(at("127.0.0.1:80"))));
        assert!(!serves(any6, true, Some(at("127.0.0.1:80"))));
        assert!(!serves(any6, true, Some(at("[::ffff:127.0.0.1]:80"))), "IPv4-mapped is IPv4");
        assert!(serves(any6, true, Some(at("[::1]:80"))));
        assert!(!serves(any6, false, Some(at("[::1]:81"))), "another port");
        assert!(serves(at("0.0.0.0:80"), false, Some(at("10.0.0.1:80"))));
        assert!(!serves(at("0.0.0.0:80"), false, Some(at("[::1]:80"))));
        assert!(serves(at("127.0.0.1:80"), false, Some(at("[::ffff:127.0.0.1]:80"))));
        assert!(!serves(at("127.0.0.1:80"), false, Some(at("127.0.0.2:80"))));
        assert!(serves(any6, false, None));
        assert!(!serves(any6, true, None));
    }
}
