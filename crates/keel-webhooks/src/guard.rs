//! Endpoint URL rules (server-side request forgery): an endpoint URL is absolute,
//! `https` (`http` only when [`UrlPolicy::allow_http`]), without user info, and its host
//! must not be or resolve to a refused address unless [`UrlPolicy::allow_private`]:
//!
//! - loopback (`127.0.0.0/8`, `::1`), unspecified (`0.0.0.0`, `::`);
//! - private (`10/8`, `172.16/12`, `192.168/16`, carrier-grade NAT `100.64/10`,
//!   unique-local `fc00::/7`);
//! - link-local (`169.254/16`, which holds the cloud metadata address
//!   `169.254.169.254`, and `fe80::/10`);
//! - broadcast, documentation, benchmarking and multicast ranges, and IPv4-mapped
//!   IPv6 forms of all of the above.
//!
//! The rules run at registration ([`validate_url`]) and again at every delivery: the
//! delivery client resolves names through [`GuardedResolver`], which refuses a name
//! when any of its addresses is refused, and connects only to the addresses it checked
//! (so a DNS answer that changed since registration — rebinding — cannot reach a
//! refused range). Redirects are never followed.

use crate::error::{Result, WebhookError};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use url::Url;

/// What endpoint URLs may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UrlPolicy {
    /// Allow `http://` URLs (local testing only).
    pub allow_http: bool,
    /// Allow hosts in loopback, private, link-local and metadata ranges (local testing only).
    pub allow_private: bool,
}

/// Longest endpoint URL, bytes.
pub const MAX_URL_LEN: usize = 2048;

/// Whether `ip` is in a range that endpoints may not reach by default.
pub fn is_refused(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return refused_v4(v4);
            }
            refused_v6(v6)
        }
    }
}

fn refused_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10 carrier-grade NAT
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18.0.0/15 benchmarking
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0.0/24 protocol assignments
        || o[0] >= 240 // reserved
}

fn refused_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // fc00::/7 unique local
        || (s[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64 (embeds IPv4)
}

/// Checks the form of `raw` and, when its host is an IP literal, the address; returns
/// the parsed URL. Names are checked by [`validate_url`] (resolving) and at delivery.
///
/// # Errors
/// [`WebhookError::InvalidUrl`].
pub fn check_form(raw: &str, policy: UrlPolicy) -> Result<Url> {
    let bad = |reason| WebhookError::InvalidUrl { reason };
    if raw.len() > MAX_URL_LEN {
        return Err(bad("must be at most 2048 bytes"));
    }
    let url = Url::parse(raw).map_err(|_| bad("must be an absolute URL"))?;
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        _ => return Err(bad("must use https")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must not contain user info"));
    }
    if url.fragment().is_some() {
        return Err(bad("must not contain a fragment"));
    }
    let ip = match url.host() {
        Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
        Some(url::Host::Domain(d)) => {
            if !policy.allow_private
                && (d.eq_ignore_ascii_case("localhost") || d.ends_with(".localhost"))
            {
                return Err(bad("resolves to a refused address range"));
            }
            None
        }
        None => return Err(bad("must name a host")),
    };
    if let Some(ip) = ip
        && !policy.allow_private
        && is_refused(ip)
    {
        return Err(bad("resolves to a refused address range"));
    }
    Ok(url)
}

/// Validates an endpoint URL at registration: [`check_form`], then (for a name) its
/// resolved addresses; a name that does not resolve is refused.
///
/// # Errors
/// [`WebhookError::InvalidUrl`].
pub async fn validate_url(raw: &str, policy: UrlPolicy) -> Result<Url> {
    let url = check_form(raw, policy)?;
    if let Some(url::Host::Domain(d)) = url.host() {
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((d, port))
            .await
            .map_err(|_| WebhookError::InvalidUrl {
                reason: "host does not resolve",
            })?
            .collect();
        if addrs.is_empty() {
            return Err(WebhookError::InvalidUrl {
                reason: "host does not resolve",
            });
        }
        if !policy.allow_private && addrs.iter().any(|a| is_refused(a.ip())) {
            return Err(WebhookError::InvalidUrl {
                reason: "resolves to a refused address range",
            });
        }
    }
    Ok(url)
}

/// The delivery client's resolver: the system resolver, then the address rules (a
/// name with any refused address fails to resolve, error class `blocked_address`).
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver {
    /// Allow refused ranges (from [`UrlPolicy::allow_private`]).
    pub allow_private: bool,
}

/// The error a [`GuardedResolver`] answers for a refused name.
#[derive(Debug, thiserror::Error)]
#[error("the endpoint host resolves to a refused address range")]
pub struct BlockedAddress;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !allow_private && addrs.iter().any(|a| is_refused(a.ip())) {
                return Err(Box::new(BlockedAddress) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_loopback_private_link_local_and_metadata() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_refused(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:4700::1111", "8.8.8.8"] {
            assert!(!is_refused(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn forms() {
        let strict = UrlPolicy::default();
        assert!(check_form("https://example.com/hook", strict).is_ok());
        assert!(check_form("http://example.com/hook", strict).is_err());
        assert!(check_form("https://127.0.0.1/hook", strict).is_err());
        assert!(check_form("https://[::1]/hook", strict).is_err());
        assert!(check_form("https://localhost/hook", strict).is_err());
        assert!(check_form("https://u:p@example.com/", strict).is_err());
        assert!(check_form("ftp://example.com/", strict).is_err());
        assert!(check_form("not a url", strict).is_err());
        let local = UrlPolicy {
            allow_http: true,
            allow_private: true,
        };
        assert!(check_form("http://127.0.0.1:8080/hook", local).is_ok());
    }
}
