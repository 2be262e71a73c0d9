//! Rate limits at the edges (SPEC section 9): a flood from more client
//! addresses than the limiter holds keeps the service answering, the
//! limiter within its bound and each client's limit in force.

use std::net::{IpAddr, Ipv4Addr};

use futures_util::stream::{self, StreamExt};
use leadrouter::config::RateLimitSettings;
use leadrouter::rate_limit::MAX_ADDRESSES;

use crate::helpers::{spawn_app_adjusted, Backend, TestApp};
use crate::intake::send_forwarded;
use crate::on_both_databases;

on_both_databases!(
    a_flood_from_200_000_forwarded_addresses_leaves_the_service_answering_and_the_limiter_bounded
);

/// Addresses of the flood, in rounds: most go straight to the server's
/// limiter, the rest are requests forwarded by the trusted proxy.
const ROUNDS: u32 = 10;
const DIRECT_PER_ROUND: u32 = 19_800;
const SENT_PER_ROUND: u32 = 200;
/// Requests of the flood in flight at once.
const CONCURRENT: usize = 16;

/// The `n`th address of 100.64.0.0/10.
fn flood_address(n: u32) -> IpAddr {
    Ipv4Addr::from(0x6440_0000 + n).into()
}

async fn a_flood_from_200_000_forwarded_addresses_leaves_the_service_answering_and_the_limiter_bounded(
    backend: Backend,
) {
    let mut website = None;
    let app = spawn_app_adjusted(backend, "", |settings| {
        settings.sources[0].rate_limit = Some(RateLimitSettings {
            per_ip: Some("2/min".parse().unwrap()),
            total: None,
        });
        settings.server.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
        website = Some(settings.sources[0].clone());
    })
    .await;
    let website = website.unwrap();
    let limiter = app.limiter.clone().expect("an in-process app");
    assert!(limiter.capacity() <= MAX_ADDRESSES);

    let per_round = DIRECT_PER_ROUND + SENT_PER_ROUND;
    let app = &app;
    for round in 0..ROUNDS {
        let first = round * per_round;
        for n in first..first + DIRECT_PER_ROUND {
            assert!(
                limiter.admit(&website, Some(flood_address(n))).is_ok(),
                "an address not seen before is admitted"
            );
        }
        let sent = first + DIRECT_PER_ROUND..first + per_round;
        let statuses: Vec<u16> = stream::iter(sent)
            .map(|n| async move {
                let client = flood_address(n).to_string();
                send_forwarded(app, &client, n as usize).await.status
            })
            .buffer_unordered(CONCURRENT)
            .collect()
            .await;
        assert!(
            statuses.iter().all(|status| *status == 200),
            "round {round}: {statuses:?}"
        );
        assert!(
            limiter.addresses() <= limiter.capacity(),
            "round {round}: {} buckets",
            limiter.addresses()
        );
    }

    // The flood's 200,000 addresses filled the table but did not grow it.
    let held = metric(app, "leadrouter_rate_limit_addresses").await;
    assert!(
        held <= limiter.capacity() && held > limiter.capacity() / 2,
        "{held} of {}",
        limiter.capacity()
    );
    // Afterwards a client is served, and still held to its limit.
    let after = ROUNDS * per_round;
    for n in after..after + 2 {
        let answer = send_forwarded(app, "203.0.113.9", n as usize).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let limited = send_forwarded(app, "203.0.113.9", after as usize + 2).await;
    assert_eq!(limited.status, 429, "{}", limited.text());
}

/// A gauge's value from `/metrics`.
async fn metric(app: &TestApp, name: &str) -> usize {
    let text = app
        .send(app.client.get(app.url("/metrics")), "")
        .await
        .text();
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}
