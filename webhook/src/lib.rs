//! graceguard's admission webhook.
//!
//! A Create whose pod name is already held, by a live pod or by one still in its
//! graceful deletion, is charged to ResourceQuota before the API server finds
//! the name taken, and the charge is not rolled back. Validating webhooks run
//! before the ResourceQuota plugin, so denying that Create here, with the same
//! 409 AlreadyExists the server would answer, keeps the quota intact while
//! clients behave as before. The same server tags pods that carry a
//! `DisruptionTarget` condition and audits every pod deletion.
//!
//! Where each rule lives:
//! * [`collision`]: the collision guard's decision, pure.
//! * [`pod_index`] and [`meta_index`]: the watch-fed index of pod names;
//!   [`watchers`]: the watches that feed it, wired to the confirmation cache.
//! * [`quota_kinds`] and [`kind_index`]: which other kinds quotas count, and
//!   their name indexes, started and stopped as quotas come and go.
//! * [`confirm`]: the live GET that confirms an index hit, cached briefly;
//!   [`read_error`]: why such a read failed.
//! * [`mode`]: conflict or retry, install-wide and per namespace.
//! * [`livelock`]: naming a client that loops on a taken name.
//! * [`review`]: AdmissionReview parsing and the error answers.
//! * [`audit`]: the audit record written for every decision.
//! * [`tagger`] and [`disruption`]: tagging pods with their DisruptionTarget reason.
//! * [`endpoints`]: each admission endpoint's policy, one module each with
//!   its typed audit reasons (the collision guard, the tagger, the deletion
//!   and eviction audits, the release check); [`handlers`]: the HTTP shell
//!   around them, which decides nothing.
//! * [`follow_up`]: tagging afterwards what cannot be tagged in its request
//!   (a node's status update, an eviction's condition).
//! * [`self_test`]: the dry-run round trip `helm test` proves.
//! * [`limits`]: what one client and all of them may hold of the admission
//!   port (connections per address, requests and body bytes in flight, the
//!   body-read deadline), refused at once at each; [`connection_life`]: how
//!   long one connection may stay idle or open.
//! * [`app`]: what every review shares (indexes, reads, queues, metrics).
//! * [`server`]: HTTPS and health listeners, routing, graceful shutdown.
//! * [`cli`]: the command line; [`command`]: what its subcommands share (the
//!   exit error, the API client).

pub mod app;
pub mod audit;
pub mod cli;
pub mod collision;
pub mod command;
pub mod confirm;
pub mod connection_life;
pub mod disruption;
pub mod endpoints;
pub mod eviction_outcome;
pub mod fencing;
pub mod follow_up;
pub mod handlers;
pub mod kind_index;
pub mod limits;
pub mod livelock;
pub mod logging;
pub mod meta_index;
pub mod metrics;
pub mod mode;
pub mod offline;
pub mod pod_index;
pub mod probe;
pub mod quota_kinds;
pub mod read_error;
pub mod review;
pub mod self_test;
pub mod server;
pub mod tagger;
pub mod watchers;
