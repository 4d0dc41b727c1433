//! A slot: one bed's share of the machine's network and cgroup names, held
//! with a lock file for as long as the bed lives, so test binaries running at
//! once never share a bridge, a CIDR, a node address or a cgroup root.
//!
//! Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range, which no
//! network here uses). Slot `n` (1..=[`MAX_SLOTS`]) has:
//! * bridge `ggbr<n>`, pod subnet 198.18.4n.0/22 (gateway .1), node `k`
//!   (1..=[`MAX_NODES`]) allocating from 198.18.(4n+k-1).2-254;
//! * node `k`'s address 198.19.n.k (on `lo`), the API server's 198.19.n.100,
//!   the Service range 198.19.n.128/25.
//!
//! With [`Family::V6`] (an IPv6 single-stack bed) the same plan comes from
//! 2001:2::/48 (RFC 5180's IPv6 benchmarking range), slot `n` written `NN`
//! in two hex digits:
//! * pod subnet 2001:2:0:NN00::/60 (gateway ::1), node `k` allocating from
//!   2001:2:0:NN0k::2-ffff;
//! * node `k`'s address 2001:2:0:NNf0::k, the API server's
//!   2001:2:0:NNf0::100, the Service range 2001:2:0:NNf1::/112.
//!
//! Before a slot is used, what its [`Ledger`] says a previous holder made (one
//! that was killed before it could clean up) is removed.

use std::fs::{File, OpenOptions};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Where slot locks and ledgers live (tmpfs: a reboot forgets them, as it
/// forgets everything they describe).
pub const RUN_DIR: &str = "/run/graceguard-testbed";
/// How many beds with real nodes may run at once on one machine.
pub const MAX_SLOTS: u8 = 60;
/// Nodes one bed may have.
pub const MAX_NODES: u8 = 4;
/// Every pod address of every slot.
pub const POD_SUPERNET: &str = "198.18.0.0/15";
/// Every address of every IPv6 slot.
pub const POD_SUPERNET_V6: &str = "2001:2::/48";

/// The IP family of a bed's network: pods, nodes, the API server and
/// Services all have addresses of this one family (single-stack).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Family {
    #[default]
    V4,
    V6,
}

/// What a bed made on the machine, written before each thing is made so a
/// sweep after a crash finds it all.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ledger {
    pub slot: u8,
    /// Bridges made (`ip link add`).
    pub bridges: Vec<String>,
    /// `ADDR/32` added to `lo`.
    pub addresses: Vec<String>,
    /// Cgroup names made in every hierarchy (`/graceguard-bed-…`): the node
    /// daemons' ([`Slot::system_cgroup`]: containerd, its shims, the
    /// kubelets, kube-proxy) and each kubelet's cgroup root (the pods).
    pub cgroup_roots: Vec<String>,
    /// kube-proxy binaries that ran: `kube-proxy --cleanup` removes their rules.
    pub kube_proxies: Vec<PathBuf>,
    /// Whether a kubelet ran (its iptables canary chains are then removed).
    pub kubelet_ran: bool,
}

/// A held slot. Dropping it releases the lock (not what the ledger lists:
/// [`crate::node::cleanup::sweep`] does that first).
pub struct Slot {
    pub n: u8,
    /// The family of every address below ([`Family::V4`] unless the bed asks).
    pub family: Family,
    lock: File,
    ledger_path: PathBuf,
    pub ledger: Ledger,
}

/// The machine's one kube-proxy: kube-proxy owns the iptables chains it
/// writes (KUBE-SERVICES and the rest) and rewrites them whole on every
/// sync, so two beds' kube-proxies in the same network namespace would erase
/// each other's Services. Held while a bed's kube-proxy runs.
pub struct ProxyLock {
    _file: std::fs::File,
}

impl ProxyLock {
    /// Waits up to `limit` for the lock; the error names its holder.
    pub fn acquire(limit: std::time::Duration) -> Result<Self> {
        std::fs::create_dir_all(RUN_DIR).with_context(|| format!("creating {RUN_DIR}"))?;
        let path = Path::new(RUN_DIR).join("kube-proxy.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let deadline = std::time::Instant::now() + limit;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                std::fs::write(&path, std::process::id().to_string())
                    .with_context(|| format!("writing {}", path.display()))?;
                return Ok(Self { _file: file });
            }
            if std::time::Instant::now() > deadline {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                bail!(
                    "another bed with a pod network (pid {}) has run kube-proxy for over {} s, and two would erase each other's Service rules; stop it (`scripts/cluster down`) or wait for it",
                    holder.trim(),
                    limit.as_secs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}

impl Slot {
    /// Takes the first free slot, sweeping what a dead holder left in it.
    pub fn acquire() -> Result<Self> {
        std::fs::create_dir_all(RUN_DIR).with_context(|| format!("creating {RUN_DIR}"))?;
        for n in 1..=MAX_SLOTS {
            if let Some(slot) = Self::try_take(n)? {
                return Ok(slot);
            }
        }
        bail!("all {MAX_SLOTS} test-bed slots in {RUN_DIR} are held by running beds; wait for them, or remove stale ones with `scripts/cluster down --all`")
    }

    /// Slot `n` if nobody holds it.
    pub fn try_take(n: u8) -> Result<Option<Self>> {
        let path = Path::new(RUN_DIR).join(format!("slot-{n}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Ok(None);
        }
        let ledger_path = Path::new(RUN_DIR).join(format!("slot-{n}.json"));
        let slot = Self {
            n,
            family: Family::V4,
            lock,
            ledger_path,
            ledger: Ledger {
                slot: n,
                ..Ledger::default()
            },
        };
        if let Some(stale) = slot.read_ledger()? {
            super::cleanup::sweep(&stale).with_context(|| {
                format!(
                    "removing what a dead test bed left in slot {n} ({})",
                    slot.ledger_path.display()
                )
            })?;
        }
        slot.save()?;
        Ok(Some(slot))
    }

    fn read_ledger(&self) -> Result<Option<Ledger>> {
        match std::fs::read(&self.ledger_path) {
            Ok(b) => Ok(Some(serde_json::from_slice(&b).with_context(|| {
                format!(
                    "reading {}; delete it after checking `ip link`, `ip addr show lo` and /sys/fs/cgroup by hand",
                    self.ledger_path.display()
                )
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.ledger_path.display())),
        }
    }

    /// Records `change` in the ledger (on disk before the caller acts on it).
    pub fn record(&mut self, change: impl FnOnce(&mut Ledger)) -> Result<()> {
        change(&mut self.ledger);
        self.save()
    }

    fn save(&self) -> Result<()> {
        let tmp = self.ledger_path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.ledger)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.ledger_path)
            .with_context(|| format!("writing {}", self.ledger_path.display()))
    }

    /// Sweeps everything the ledger lists, then forgets it.
    pub fn clean(&mut self) -> Result<()> {
        super::cleanup::sweep(&self.ledger)?;
        self.ledger = Ledger {
            slot: self.n,
            ..Ledger::default()
        };
        let _ = std::fs::remove_file(&self.ledger_path);
        Ok(())
    }

    pub fn bridge(&self) -> String {
        format!("ggbr{}", self.n)
    }

    fn base(&self) -> u8 {
        self.n.saturating_mul(4)
    }

    /// Address `low` in the IPv6 slot's `/64` number `net` (0x00–0xff).
    fn v6(&self, net: u16, low: u16) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 2, 0, u16::from(self.n) << 8 | net, 0, 0, 0, low)
    }

    /// Every address of the bed's family the bed may use (pods' routes,
    /// kube-proxy's NodePort addresses).
    pub fn supernet(&self) -> &'static str {
        match self.family {
            Family::V4 => POD_SUPERNET,
            Family::V6 => POD_SUPERNET_V6,
        }
    }

    /// The bridge's address and prefix (the pods' gateway).
    pub fn gateway(&self) -> (IpAddr, u8) {
        match self.family {
            Family::V4 => (Ipv4Addr::new(198, 18, self.base(), 1).into(), 22),
            Family::V6 => (self.v6(0, 1).into(), 60),
        }
    }

    pub fn pod_subnet(&self) -> String {
        match self.family {
            Family::V4 => format!("198.18.{}.0/22", self.base()),
            Family::V6 => format!("{}/60", self.v6(0, 0)),
        }
    }

    /// The addresses node `k` (1-based) hands its pods.
    pub fn pod_range(&self, k: u8) -> (IpAddr, IpAddr) {
        let k = k.clamp(1, MAX_NODES);
        match self.family {
            Family::V4 => {
                let third = self.base() + (k - 1);
                (
                    Ipv4Addr::new(198, 18, third, 2).into(),
                    Ipv4Addr::new(198, 18, third, 254).into(),
                )
            }
            Family::V6 => (
                self.v6(u16::from(k), 2).into(),
                self.v6(u16::from(k), 0xffff).into(),
            ),
        }
    }

    /// Node `k`'s address (kubelet's node IP, on `lo`).
    pub fn node_ip(&self, k: u8) -> IpAddr {
        match self.family {
            Family::V4 => Ipv4Addr::new(198, 19, self.n, k).into(),
            Family::V6 => self.v6(0xf0, u16::from(k)).into(),
        }
    }

    /// The API server's address on the bed's network, when pods must reach it.
    pub fn apiserver_ip(&self) -> IpAddr {
        match self.family {
            Family::V4 => Ipv4Addr::new(198, 19, self.n, 100).into(),
            Family::V6 => self.v6(0xf0, 0x100).into(),
        }
    }

    pub fn service_cidr(&self) -> String {
        match self.family {
            Family::V4 => format!("198.19.{}.128/25", self.n),
            Family::V6 => format!("{}/112", self.v6(0xf1, 0)),
        }
    }

    /// The `kubernetes` Service's ClusterIP: the Service range's first address.
    pub fn kubernetes_service_ip(&self) -> IpAddr {
        match self.family {
            Family::V4 => Ipv4Addr::new(198, 19, self.n, 129).into(),
            Family::V6 => self.v6(0xf1, 1).into(),
        }
    }

    /// The cgroup name the bed's node daemons run in.
    pub fn system_cgroup(&self) -> String {
        format!("/graceguard-bed-{}-system", self.n)
    }

    /// The cgroup name node `k`'s kubelet puts its pods under.
    pub fn cgroup_root(&self, k: u8) -> String {
        format!("/graceguard-bed-{}-node-{k}", self.n)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: unlocking a descriptor we own (closing it would too).
        unsafe {
            libc::flock(self.lock.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// Whether any slot other than `mine` is held by a running bed.
pub fn others_running(mine: u8) -> bool {
    (1..=MAX_SLOTS).filter(|n| *n != mine).any(|n| {
        let path = Path::new(RUN_DIR).join(format!("slot-{n}.lock"));
        let Ok(f) = File::open(&path) else {
            return false;
        };
        // SAFETY: flock on a descriptor we own.
        let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        !free
    })
}
