//! `[server] trusted_sources`: address ranges in CIDR notation (`127.0.0.1/32`, `::1/128`,
//! `10.0.0.0/8`; a bare address is a single host), parsed by hand.
//!
//! Invariant: an IPv4-mapped IPv6 peer (`::ffff:127.0.0.1`, what a dual-stack socket reports)
//! is matched as the IPv4 address it carries; IPv4 ranges never match other IPv6 peers.

use std::net::IpAddr;

/// One address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    len: u8,
}

impl Cidr {
    /// Parses `addr/len` or a bare `addr`; `None` if either part is invalid or `len` is too long.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, len) = match s.trim().split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s.trim(), None),
        };
        let net: IpAddr = addr.parse().ok()?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) if l.bytes().all(|b| b.is_ascii_digit()) && !l.is_empty() => {
                l.parse::<u8>().ok().filter(|&n| n <= max)?
            }
            Some(_) => return None,
        };
        Some(Self { net, len })
    }

    /// Whether `ip` lies in this range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.len),
            _ => false,
        }
    }
}

/// Whether the first `len` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (bytes, bits) = (usize::from(len / 8), len % 8);
    if a[..bytes] != b[..bytes] {
        return false;
    }
    bits == 0 || {
        let mask = 0xffu8 << (8 - bits);
        a[bytes] & mask == b[bytes] & mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_ranges_and_refuses_nonsense() {
        assert!(Cidr::parse("127.0.0.1/32").is_some());
        assert!(Cidr::parse("::1/128").is_some());
        assert!(Cidr::parse("10.0.0.0/8").is_some());
        assert!(Cidr::parse("192.168.1.7").is_some());
        for bad in [
            "",
            "/8",
            "10.0.0.0/33",
            "::1/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0/8",
            "host/8",
        ] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn matches_by_prefix_and_maps_ipv4_in_ipv6() {
        let lo = Cidr::parse("127.0.0.1/32").unwrap();
        assert!(lo.contains(ip("127.0.0.1")));
        assert!(!lo.contains(ip("127.0.0.2")));
        assert!(lo.contains(ip("::ffff:127.0.0.1")), "dual-stack form");
        assert!(!lo.contains(ip("::1")));
        let ten = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(ten.contains(ip("10.255.1.2")) && !ten.contains(ip("11.0.0.1")));
        let odd = Cidr::parse("192.168.0.0/23").unwrap();
        assert!(odd.contains(ip("192.168.1.200")) && !odd.contains(ip("192.168.2.1")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        assert!(Cidr::parse("::1").unwrap().contains(ip("::1")));
    }
}
