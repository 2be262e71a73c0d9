//! The client's IP address (SPEC section 9), for rate limits and
//! attribution alike: the TCP peer, or, when the peer is one of
//! `server.trusted_proxies`, the address that the `Forwarded` (or else
//! `X-Forwarded-For`) header names: walking the chain from the right, the
//! first hop that is not itself a trusted proxy. A header from any other
//! peer changes nothing, so it cannot be spoofed.

use std::net::IpAddr;
use std::str::FromStr;

use actix_web::http::header::HeaderMap;
use ipnet::IpNet;

/// One `server.trusted_proxies` entry: a CIDR (`10.0.0.0/8`) or one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRange(IpNet);

impl FromStr for ProxyRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        text.parse::<IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
            .map(Self)
            .map_err(|_| format!("not a CIDR or IP address: {text:?}"))
    }
}

impl<'de> serde::Deserialize<'de> for ProxyRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl ProxyRange {
    fn contains(&self, ip: &IpAddr) -> bool {
        self.0.contains(&canonical(*ip))
    }
}

/// The client's address for a request from `peer` with `headers`.
pub fn client_ip(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &[ProxyRange],
) -> Option<IpAddr> {
    let peer = peer.map(canonical)?;
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|range| range.contains(ip));
    if !is_trusted(&peer) {
        return Some(peer);
    }
    let chain = forwarded_chain(headers);
    let client = chain
        .iter()
        .rev()
        .find(|hop| !is_trusted(hop))
        .or_else(|| chain.first())
        .copied();
    Some(client.unwrap_or(peer))
}

/// The addresses a request passed through, client first: `Forwarded`'s
/// `for=` values, else `X-Forwarded-For`. Entries that are not addresses
/// (`unknown`, obfuscated names) are left out.
fn forwarded_chain(headers: &HeaderMap) -> Vec<IpAddr> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(|part| part.trim().to_string())
            .collect()
    };
    let forwarded: Vec<IpAddr> = values("forwarded")
        .iter()
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                key.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_hop(value))
                    .flatten()
            })
        })
        .collect();
    if !forwarded.is_empty() {
        return forwarded;
    }
    values("x-forwarded-for")
        .iter()
        .filter_map(|hop| parse_hop(hop))
        .collect()
}

/// `192.0.2.1`, `192.0.2.1:8080`, `"[2001:db8::1]:4711"`, `2001:db8::1`.
fn parse_hop(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok().map(canonical);
    }
    let (host, _port) = text.rsplit_once(':')?;
    host.parse().ok().map(canonical)
}

/// An IPv4 address mapped into IPv6 (`::ffff:10.0.0.1`) as plain IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        map
    }

    fn ranges(list: &[&str]) -> Vec<ProxyRange> {
        list.iter().map(|text| text.parse().unwrap()).collect()
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn only_a_trusted_peer_may_name_the_client() {
        let forwarded = headers(&[("x-forwarded-for", "203.0.113.7")]);
        let trusted = ranges(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &forwarded, &trusted),
            ip("203.0.113.7")
        );
        assert_eq!(
            client_ip(ip("198.51.100.9"), &forwarded, &trusted),
            ip("198.51.100.9")
        );
        assert_eq!(client_ip(ip("10.1.2.3"), &forwarded, &[]), ip("10.1.2.3"));
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        // A client that sends its own X-Forwarded-For cannot choose its IP.
        let chain = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.2")]);
        let trusted = ranges(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &chain, &trusted),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn forwarded_is_read_first_with_ports_quotes_and_ipv6() {
        let both = headers(&[
            (
                "forwarded",
                "for=\"[2001:db8::1]:4711\";proto=https, for=10.0.0.5",
            ),
            ("x-forwarded-for", "198.51.100.1"),
        ]);
        let trusted = ranges(&["10.0.0.0/8", "127.0.0.1"]);
        assert_eq!(
            client_ip(ip("127.0.0.1"), &both, &trusted),
            ip("2001:db8::1")
        );
        let with_port = headers(&[("forwarded", "for=192.0.2.60:8080")]);
        assert_eq!(
            client_ip(ip("127.0.0.1"), &with_port, &trusted),
            ip("192.0.2.60")
        );
        assert!("not-an-ip".parse::<ProxyRange>().is_err());
    }
}
