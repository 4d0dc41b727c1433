//! The API server's clock as this process sees it: the offset between the
//! two, measured once from the `Date` header of one request.
//!
//! A task's deadline counts from its start. A process that takes a task over
//! (a restart elsewhere, a failover) must not compare another host's clock
//! with its own: it counts what the task had spent when its newest pod was
//! created (the pod's record, by the creating process's monotonic clock)
//! plus how long ago the API server created that pod (the pod's
//! creationTimestamp against the API server's clock now, both the server's).
//! This offset turns the server's "now" into this process's.

use std::time::Duration;

use k8s_openapi::jiff::fmt::rfc2822::DateTimeParser;
use kube::Client;

static PARSER: DateTimeParser = DateTimeParser::new();

/// How long the measurement may take before the process goes on without it
/// (deadlines then fall back to the launching process's recorded start).
const WITHIN: Duration = Duration::from_secs(5);

/// The API server's clock minus this process's (`local_ms` reads the
/// latter), from the `Date` of a `GET /version`; `None` if it could not be
/// read.
pub async fn offset_ms(client: &Client, local_ms: impl Fn() -> i64) -> Option<i64> {
    let request = http::Request::get("/version")
        .body(Vec::new())
        .ok()?
        .map(kube::client::Body::from);
    let sent = local_ms();
    let answer = tokio::time::timeout(WITHIN, client.send(request)).await;
    let received = local_ms();
    let date = match answer {
        Ok(Ok(response)) => response
            .headers()
            .get(http::header::DATE)?
            .to_str()
            .ok()?
            .to_string(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not read the API server's clock; a task taken over from another process counts its deadline from that process's recorded start");
            return None;
        }
        Err(_) => {
            tracing::warn!("the API server's clock did not answer within 5 s; a task taken over from another process counts its deadline from that process's recorded start");
            return None;
        }
    };
    offset_from(&date, sent, received)
}

/// The offset a `Date` header `date` gives for a request sent at `sent` and
/// answered at `received` (this process's ms). The header has whole seconds,
/// truncated: the server's time was within the second after it, taken at its
/// middle, and compared with the middle of the round trip.
pub fn offset_from(date: &str, sent: i64, received: i64) -> Option<i64> {
    let server = PARSER.parse_timestamp(date).ok()?.as_millisecond() + 500;
    let local = sent + (received - sent) / 2;
    Some(server - local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_the_servers_second_against_the_round_trips_middle() {
        let at = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000)
            .map(|t| t.as_millisecond())
            .unwrap_or_default();
        let date = "Fri, 15 Jan 2027 08:00:00 GMT";
        assert_eq!(
            PARSER
                .parse_timestamp(date)
                .map(|t| t.as_millisecond())
                .ok(),
            Some(at)
        );
        // This host's clock an hour behind the server's, a 200 ms round trip.
        let local = at - 3_600_000;
        assert_eq!(
            offset_from(date, local, local + 200),
            Some(3_600_000 + 500 - 100)
        );
        assert_eq!(offset_from("yesterday", 0, 1), None);
    }
}
