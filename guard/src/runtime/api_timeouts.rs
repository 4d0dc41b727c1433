//! How long any call to the API server may go without an answer.
//!
//! kube's client has no read timeout by default, and its watcher gives up on
//! a silent watch only after the watch's `timeoutSeconds` (290 by default)
//! plus 5 s. A connection that goes silent without a reset (a load balancer
//! or NAT entry dropped, an API server replica stalled, a restart that leaves
//! a half-open connection) then holds the executor's pod watch for minutes
//! while its Lease, renewed over other connections, keeps the fence open: the
//! sidecar holds nothing wrong but sees no pod change. Two bounds end that:
//!
//! * every watch asks the API server to end it after [`WATCH_TIMEOUT_SECS`],
//!   and kube's watcher abandons one that stays silent 5 s past that;
//! * every other call (and a watch whose answer never starts) fails after
//!   [`READ_TIMEOUT`] without a byte, counted from when it was sent, and is
//!   retried over a new connection: a Create so ended reads as "no answer",
//!   which the reconciler already resolves by reading the name.
//!
//! A silent pooled connection costs one [`READ_TIMEOUT`] each time it is
//! handed out, until it is dropped (hyper drops connections idle for 90 s).

use std::time::Duration;

use kube::runtime::watcher;

/// The `timeoutSeconds` of every watch the guard opens: one more watch call
/// per watcher every 15 s, against a silent watch noticed within 20 s.
pub const WATCH_TIMEOUT_SECS: u32 = 15;

/// The longest any call may wait for the API server's next byte. Above
/// [`WATCH_TIMEOUT_SECS`] plus kube's 5 s idle margin, so a quiet but healthy
/// watch is never cut by it; far above a healthy answer's time (the API
/// server answers or times out a request itself, 60 s by default, but the
/// guard's own calls are single objects or pages of 500).
pub const READ_TIMEOUT: Duration = Duration::from_secs(25);

/// The watch configuration of every watcher the guard runs.
pub fn watch_config(selector: &str) -> watcher::Config {
    watcher::Config::default()
        .labels(selector)
        .timeout(WATCH_TIMEOUT_SECS)
}

/// `config` with the guard's read timeout, counted from each request's send
/// (not from when its pooled connection went idle). Library users building
/// their own client should do the same.
pub fn bounded(mut config: kube::Config) -> kube::Config {
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_healthy_watch_is_never_cut_by_the_read_timeout() {
        // kube's watcher abandons a silent watch 5 s past its timeout.
        let silent_watch_abandoned = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS) + 5);
        assert!(READ_TIMEOUT > silent_watch_abandoned);
        let c = bounded(kube::Config::new(
            "https://127.0.0.1:6443".parse().unwrap_or_default(),
        ));
        assert_eq!(c.read_timeout, Some(READ_TIMEOUT));
        assert!(c.reset_reader_on_write);
        assert_eq!(watch_config("a=b").timeout, Some(WATCH_TIMEOUT_SECS));
    }
}
