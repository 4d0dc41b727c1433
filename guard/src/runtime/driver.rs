//! [`Guard`]: one task run to its end through an [`Executor`], for callers
//! that want a single call (the library's simplest use, `graceguard run`).

use k8s_openapi::api::core::v1::Pod;
use kube::Client;

use crate::core::phase::Transition;
use crate::core::reconcile::{Outcome, TaskSpec};
use crate::core::task::TaskKey;
use crate::core::template::Template;
use crate::runtime::error::GuardError;
use crate::runtime::executor::{Executor, ExecutorConfig};

/// How a [`Guard`] behaves: the executor's settings.
pub type GuardConfig = ExecutorConfig;

/// Runs tasks by graceguard's rules, each through its own executor scoped to
/// the task's namespace. Cheap to share.
pub struct Guard {
    client: Client,
    config: GuardConfig,
}

impl Guard {
    /// A guard acting through `client`. Build it from a config passed
    /// through [`crate::runtime::api_timeouts::bounded`]: without a read timeout a
    /// connection that goes silent can hold a call, and the executor's view
    /// of its pods, for minutes.
    pub fn new(client: Client, config: GuardConfig) -> Self {
        Self { client, config }
    }

    /// An executor for `namespace`, as [`Guard::run`] uses.
    pub fn executor(&self, namespace: &str) -> Executor {
        let mut config = self.config.clone();
        config.namespace = Some(namespace.to_string());
        Executor::start(self.client.clone(), config)
    }

    /// Runs one task to completion from `template` (a Pod; its name is
    /// replaced by the attempt's). `on_transition` sees every phase change.
    /// A task whose pods exist from an earlier run of this instance is
    /// resumed, not started again.
    pub async fn run(
        &self,
        spec: TaskSpec,
        template: Pod,
        on_transition: impl FnMut(&Transition),
    ) -> Result<Outcome, GuardError> {
        let template = Template::from_pod(&template)?;
        let executor = self.executor(&spec.namespace);
        let key = TaskKey::new(&spec.namespace, &spec.task);
        executor.submit(spec, template).await?;
        Ok(executor.wait_result(&key, on_transition).await?)
    }
}
