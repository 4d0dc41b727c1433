//! `GET /v1/tasks`'s `continue` token: the last (namespace, task) of the
//! page, so the next page starts after it however tasks come and go.

/// The token for a page ending at `namespace`/`task`.
pub fn encode(namespace: &str, task: &str) -> String {
    format!("{namespace}/{task}")
}

/// The (namespace, task) a token names; `None` if it is not one.
pub fn decode(token: &str) -> Option<(String, String)> {
    let (ns, task) = token.split_once('/')?;
    let valid = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    (valid(ns) && valid(task)).then(|| (ns.to_string(), task.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_the_last_task_of_its_page() {
        assert_eq!(
            decode(&encode("team-a", "train.v2")),
            Some(("team-a".into(), "train.v2".into()))
        );
        for bad in ["", "x", "/t", "ns/", "ns/a/b", "ns/a b"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
