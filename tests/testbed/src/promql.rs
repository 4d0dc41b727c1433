//! The metric names a PromQL expression reads, so a test can check that every
//! series an alert or a dashboard panel names is really exported. Not a
//! parser: `promtool check rules` proves the expressions valid (the chart
//! tests); this only has to find the names in valid PromQL.

use std::collections::BTreeSet;

/// PromQL's keywords and modifiers: identifiers that are never metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    // Aggregation operators: `sum by (x) (...)` puts a clause between the
    // operator and its parenthesis.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names `expr` selects: identifiers outside label matchers
/// (`{...}`), range and subquery selectors (`[...]`), string literals and
/// grouping lists (`by (...)` and the like), that are not a function call or
/// a keyword.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // After a grouping keyword, the next parenthesised list holds label names.
    let mut label_list_next = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            '{' => i = skip_to(&chars, i, '}'),
            '[' => i = skip_to(&chars, i, ']'),
            '(' if label_list_next => {
                label_list_next = false;
                i = skip_to(&chars, i, ')');
            }
            // A number or a duration (`0.05`, `5m`, `1e3`), never a name.
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let called = chars.get(j) == Some(&'(');
                let lower = word.to_ascii_lowercase();
                if matches!(
                    lower.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    label_list_next = true;
                } else if !called && !KEYWORDS.contains(&lower.as_str()) {
                    names.insert(word);
                }
                continue;
            }
            _ => i += 1,
        }
    }
    names
}

/// The index after the string literal that starts at `i`.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if quote != '`' => j += 2,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    j
}

/// The index after the `close` that ends the group opened at `i` (string
/// literals inside it skipped whole).
fn skip_to(chars: &[char], i: usize, close: char) -> usize {
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '"' | '\'' | '`' => j = skip_string(chars, j),
            c if c == close => return j + 1,
            _ => j += 1,
        }
    }
    j
}

/// The metric names a Prometheus text exposition has samples of (`# HELP`,
/// `# TYPE` and `# EOF` lines are not samples).
pub fn exposed_samples(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let end = l.find(['{', ' '])?;
            Some(l[..end].to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn names_outside_matchers_ranges_strings_and_groupings() {
        assert_eq!(
            names(
                r#"sum by (namespace, pod) (rate(graceguard_confirmation_errors_total{namespace="a", job=~"x.*"}[5m])) / sum by (namespace, pod) (rate(graceguard_confirmation_gets_total[5m])) > 0.05"#
            ),
            [
                "graceguard_confirmation_errors_total",
                "graceguard_confirmation_gets_total"
            ]
        );
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (le) (rate(apiserver_admission_webhook_admission_duration_seconds_bucket{name=~".*\\.graceguard\\.io"}[5m]))) > 2000 / 2000"#
            ),
            ["apiserver_admission_webhook_admission_duration_seconds_bucket"]
        );
        assert_eq!(names(r#"absent(up{job="graceguard"} == 1)"#), ["up"]);
        assert_eq!(
            names("min by (kind) (a) == 0 unless on (namespace, pod, kind) (b == 1) and bool c offset 5m"),
            ["a", "b", "c"]
        );
        assert_eq!(
            names("max without (x) (d_2) > 1e3 or sum(e[5m:30s]) < .5 or count(f) * 2"),
            ["d_2", "e", "f"]
        );
    }

    #[test]
    fn samples_of_an_exposition() {
        let text = "# HELP a_total x\n# TYPE a_total counter\na_total 1\nb_bucket{le=\"1\"} 0\nc{x=\"y z\"} 2\n# EOF\n";
        assert_eq!(
            exposed_samples(text).into_iter().collect::<Vec<_>>(),
            ["a_total", "b_bucket", "c"]
        );
    }
}
