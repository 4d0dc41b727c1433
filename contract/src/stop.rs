//! How both command lines learn they are to stop: SIGTERM (how Kubernetes,
//! Argo and Airflow stop a process) or SIGINT (Ctrl-C).

use std::future::Future;

use tokio::signal::unix::{signal, SignalKind};

/// The signal that asked the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
}

impl Stop {
    /// The shell's exit code for a process ended by it: 128 + its number.
    pub fn exit_code(self) -> i32 {
        match self {
            Stop::Interrupt => 130,
            Stop::Terminate => 143,
        }
    }

    /// Its name, for a message.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Interrupt => "SIGINT",
            Stop::Terminate => "SIGTERM",
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM. The handlers are installed when
/// this is called, not when the future is first polled, so a signal that
/// comes in between is not lost (nor does it kill the process).
pub fn signal_to_stop() -> std::io::Result<impl Future<Output = Stop>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => Stop::Interrupt,
            _ = terminate.recv() => Stop::Terminate,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sigterm_sent_after_the_call_stops_with_143() -> std::io::Result<()> {
        let stop = signal_to_stop()?;
        // SIGTERM to this very process: its handler is installed above, so
        // the process goes on and the future resolves.
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()?;
        assert!(sent.success());
        let s = stop.await;
        assert_eq!(s, Stop::Terminate);
        assert_eq!(s.exit_code(), 143);
        assert_eq!(Stop::Interrupt.exit_code(), 130);
        Ok(())
    }
}
