//! A private PostgreSQL server for Airflow's metadata database (Airflow
//! refuses SQLite with the KubernetesExecutor): Debian's `postgresql`
//! binaries, a fresh cluster in the test's directory, run as the
//! `postgres` user, listening on a free loopback port only, trust
//! authentication (nothing but this machine's loopback reaches it), fsync
//! off (it is thrown away with the test).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::{tail, Managed};

/// A running server.
pub struct Postgres {
    pub port: u16,
    bin: PathBuf,
    _process: Managed,
}

/// The newest `/usr/lib/postgresql/<major>/bin`.
fn bin_dir() -> Result<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: install Debian's postgresql package (scripts/test does: apt-get install postgresql)")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, p)| p.join("postgres").is_file())
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, p)| p).context(
        "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: apt-get install postgresql",
    )
}

/// The `postgres` user's uid and gid (the server refuses to run as root).
fn postgres_ids() -> Result<(u32, u32)> {
    let out = Command::new("id").args(["-u", "postgres"]).output()?;
    let gid = Command::new("id").args(["-g", "postgres"]).output()?;
    let parse = |o: &std::process::Output| -> Result<u32> {
        Ok(String::from_utf8_lossy(&o.stdout).trim().parse()?)
    };
    match (parse(&out), parse(&gid)) {
        (Ok(u), Ok(g)) => Ok((u, g)),
        _ => bail!(
            "there is no postgres user: install Debian's postgresql package, which creates it"
        ),
    }
}

impl Postgres {
    /// Starts a fresh server with its data under `dir`, a superuser
    /// `airflow` and a database `airflow`.
    pub async fn start(dir: &Path) -> Result<Self> {
        let bin = bin_dir()?;
        let (uid, gid) = postgres_ids()?;
        let data = dir.join("pgdata");
        let sockets = dir.join("pgsock");
        for d in [&data, &sockets] {
            std::fs::create_dir_all(d)?;
            std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
        }
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).ok();
        let as_postgres = |program: &str| {
            let mut c = Command::new(bin.join(program));
            c.uid(uid).gid(gid);
            c
        };
        let init = as_postgres("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "airflow",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&data)
            .output()
            .context("running initdb")?;
        if !init.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&init.stderr));
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let mut cmd = as_postgres("postgres");
        cmd.arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(&sockets)
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]);
        let log = dir.join("postgres.log");
        let process = Managed::spawn("postgres", cmd, &log)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "airflow"])
                .output()?;
            if ready.status.success() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "PostgreSQL did not accept connections within 60 s; its log:\n{}",
                    tail(&log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let pg = Self {
            port,
            bin,
            _process: process,
        };
        pg.create_database("airflow")?;
        Ok(pg)
    }

    /// Creates database `name`.
    pub fn create_database(&self, name: &str) -> Result<()> {
        let out = Command::new(self.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "airflow",
                name,
            ])
            .output()?;
        if !out.status.success() {
            bail!("createdb {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The SQLAlchemy URL of database `name` (psycopg2).
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgresql+psycopg2://airflow@127.0.0.1:{}/{name}",
            self.port
        )
    }
}
