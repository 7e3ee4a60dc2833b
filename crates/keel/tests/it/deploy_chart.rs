//! The Helm chart (`deploy/helm/keel`) and the image recipe (`deploy/Containerfile`)
//! against Keel's configuration, by reading them (nothing is started, helm is not
//! needed): probe paths are routes the role serves, ports are the ports of the default
//! listen addresses, every `KEEL_…` env name is one Keel reads, the termination grace of
//! a role comes from one value, and values.yaml documents every key.

use keel::config::{Config, DEFAULT_TOML};
use regex::Regex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const ROLES: [&str; 3] = ["api", "runner", "indexer"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn chart(rel: &str) -> String {
    read(&format!("deploy/helm/keel/{rel}"))
}

fn templates() -> Vec<(String, String)> {
    let dir = root().join("deploy/helm/keel/templates");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "tpl")))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(
        out.len() >= 5,
        "chart templates missing in {}",
        dir.display()
    );
    out
}

/// values.yaml as dotted key -> scalar text (quotes removed), and the keys that have no
/// comment line directly above them. Block scalars (`key: |`) are one value.
fn parse_values(text: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let key_line = Regex::new(r"^( *)([A-Za-z0-9_]+):(?: +(.*))?$").unwrap();
    let mut values = BTreeMap::new();
    let mut undocumented = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut previous_is_comment = false;
    let mut block_indent: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        if let Some(key_indent) = block_indent {
            if line.trim().is_empty() || indent > key_indent {
                continue;
            }
            block_indent = None;
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            previous_is_comment = false;
            continue;
        }
        if trimmed.starts_with('#') {
            previous_is_comment = true;
            continue;
        }
        let caps = key_line.captures(line).unwrap_or_else(|| {
            panic!(
                "values.yaml line {}: not a `key: value` line: {line}",
                n + 1
            )
        });
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let key = caps[2].to_owned();
        let path = stack
            .iter()
            .map(|(_, k)| k.as_str())
            .chain([key.as_str()])
            .collect::<Vec<_>>()
            .join(".");
        if !previous_is_comment {
            undocumented.push(path.clone());
        }
        previous_is_comment = false;
        let value = caps.get(3).map(|m| m.as_str().trim()).unwrap_or("");
        if value.is_empty() {
            stack.push((indent, key));
        } else if value == "|" || value == ">" {
            block_indent = Some(indent);
            values.insert(path, String::new());
        } else {
            values.insert(path, value.trim_matches('"').to_owned());
        }
    }
    (values, undocumented)
}

fn values() -> BTreeMap<String, String> {
    parse_values(&chart("values.yaml")).0
}

fn value<'a>(values: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    values
        .get(key)
        .unwrap_or_else(|| panic!("values.yaml has no key `{key}`"))
}

/// The port of an `ip:port` address.
fn port_of(address: &str) -> u16 {
    address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("`{address}` is not ip:port"))
}

fn defaults() -> Config {
    Config::load_with_env(None, Vec::new()).expect("the defaults load")
}

/// Every key of the configuration: the defaults' text, the serialized defaults (keys
/// whose defaults are not written in the file), and the optional signer tables.
fn config_tree() -> toml::Table {
    let mut tree: toml::Table = DEFAULT_TOML.parse().expect("default.toml parses");
    let serialized = toml::Value::try_from(defaults()).expect("the defaults serialize");
    merge(&mut tree, serialized.as_table().unwrap());
    let signer: toml::Table = keel::signer::SIGNER_KEYS
        .iter()
        .map(|k| ((*k).to_owned(), toml::Value::String(String::new())))
        .collect();
    for (section, key) in [("operator", "signer"), ("aa", "sponsorSigner")] {
        tree.get_mut(section)
            .and_then(toml::Value::as_table_mut)
            .unwrap_or_else(|| panic!("no [{section}] in the defaults"))
            .insert(key.to_owned(), toml::Value::Table(signer.clone()));
    }
    tree
}

fn merge(into: &mut toml::Table, from: &toml::Table) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
}

/// The canonical dotted key a `KEEL__A__B` variable names, walking the configuration
/// case-insensitively (any chain name under `chains`); `None` when it names no key.
fn config_key(tree: &toml::Table, env_name: &str) -> Option<String> {
    let rest = env_name.strip_prefix(keel::config::ENV_PREFIX)?;
    let local_chain = tree.get("chains")?.get("local")?.as_table()?.clone();
    let mut table = tree.clone();
    let mut path = Vec::new();
    let segments: Vec<&str> = rest.split("__").collect();
    for (i, segment) in segments.iter().enumerate() {
        let (key, next) = if path.len() == 1 && path[0] == "chains" {
            // A chain's name: any; its keys are those of the default chain.
            (
                segment.to_ascii_lowercase(),
                Some(toml::Value::Table(local_chain.clone())),
            )
        } else {
            let (k, v) = table
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(segment))?;
            (k.clone(), Some(v.clone()))
        };
        path.push(key);
        match next {
            Some(toml::Value::Table(t)) => table = t,
            Some(_) if i + 1 == segments.len() => {}
            _ => return None,
        }
    }
    Some(path.join("."))
}

/// `KEEL…` names in a text (env names, `KEEL_ROLE`, ...).
fn keel_names(text: &str) -> Vec<String> {
    let re = Regex::new(r"\bKEEL_[A-Z0-9_]*[A-Z0-9]").unwrap();
    let mut names: Vec<String> = re.find_iter(text).map(|m| m.as_str().to_owned()).collect();
    names.sort();
    names.dedup();
    names
}

/// The `ENV` of the Containerfile as name -> value.
fn image_env() -> BTreeMap<String, String> {
    let text = read("deploy/Containerfile");
    let joined = text.replace("\\\n", " ");
    let env_line = joined
        .lines()
        .find(|l| l.starts_with("ENV "))
        .expect("the Containerfile sets ENV");
    env_line[4..]
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("ENV name=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// Literal routes of an axum router source (`.route("/path"`).
fn routes(rel: &str) -> Vec<String> {
    let re = Regex::new(r#"\.route\(\s*"([^"]+)""#).unwrap();
    re.captures_iter(&read(rel))
        .map(|c| c[1].to_owned())
        .collect()
}

#[test]
fn values_yaml_has_a_comment_above_every_key() {
    let (values, undocumented) = parse_values(&chart("values.yaml"));
    assert!(values.len() > 20, "values.yaml parsed to {values:?}");
    assert!(
        undocumented.is_empty(),
        "keys of values.yaml without a comment line above them: {undocumented:?}"
    );
    // The parser itself: an undocumented key is found.
    let (_, missing) = parse_values("# a\na: 1\nb:\n  # c\n  c: 2\n");
    assert_eq!(missing, vec!["b".to_owned()]);
}

#[test]
fn every_values_reference_of_the_templates_exists() {
    let values = values();
    let re = Regex::new(r"\.Values\.([A-Za-z0-9_.]+)").unwrap();
    for (file, text) in templates() {
        for c in re.captures_iter(&text) {
            let key = &c[1];
            let known = values.contains_key(key)
                || values.keys().any(|k| k.starts_with(&format!("{key}.")));
            assert!(known, "{file}: .Values.{key} is not in values.yaml");
        }
    }
}

#[test]
fn ports_are_the_ports_of_the_listen_addresses() {
    let config = defaults();
    let values = values();
    let api: u16 = value(&values, "ports.api").parse().unwrap();
    let metrics: u16 = value(&values, "ports.metrics").parse().unwrap();
    assert_eq!(
        api,
        port_of(&config.api.listen_address),
        "ports.api vs api.listenAddress"
    );
    assert_eq!(
        metrics,
        port_of(&config.telemetry.metrics_address),
        "ports.metrics vs telemetry.metricsAddress"
    );
    let env = image_env();
    assert_eq!(
        port_of(&env["KEEL__API__LISTENADDRESS"]),
        api,
        "the image's api port"
    );
    assert_eq!(
        port_of(&env["KEEL__TELEMETRY__METRICSADDRESS"]),
        metrics,
        "the image's telemetry port"
    );
    let containerfile = read("deploy/Containerfile");
    assert!(
        containerfile.contains(&format!("EXPOSE {api} {metrics}")),
        "the Containerfile exposes {api} and {metrics}"
    );
    // Each named container port is the value of its listen address.
    let re = Regex::new(r"- name: (\w+)\s*\n\s*containerPort: \{\{ \.Values\.([A-Za-z.]+) \}\}")
        .unwrap();
    for role in ROLES {
        let text = chart(&format!("templates/deployment-{role}.yaml"));
        let ports: BTreeMap<String, String> = re
            .captures_iter(&text)
            .map(|c| (c[1].to_owned(), c[2].to_owned()))
            .collect();
        assert_eq!(
            ports.get("metrics").map(String::as_str),
            Some("ports.metrics"),
            "{role}"
        );
        if role == "api" {
            assert_eq!(
                ports.get("http").map(String::as_str),
                Some("ports.api"),
                "{role}"
            );
        } else {
            assert!(!ports.contains_key("http"), "{role} serves no API port");
        }
        // The listen addresses the chart passes use the same values.
        let helpers = chart("templates/_helpers.tpl");
        assert!(helpers.contains("value: \"0.0.0.0:{{ .Values.ports.api }}\""));
        assert!(helpers.contains("value: \"0.0.0.0:{{ .Values.ports.metrics }}\""));
    }
}

#[test]
fn probes_ask_paths_the_role_serves_on_the_port_that_serves_them() {
    let telemetry = routes("crates/keel/src/telemetry.rs");
    let api = routes("crates/keel-api/src/lib.rs");
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert!(
            telemetry.contains(&path.to_owned()),
            "telemetry.rs serves {path}: {telemetry:?}"
        );
    }
    let probe = Regex::new(
        r"(readinessProbe|livenessProbe):\s*\n\s*httpGet:\s*\n\s*path: (\S+)\s*\n\s*port: (\S+)",
    )
    .unwrap();
    for role in ROLES {
        let text = chart(&format!("templates/deployment-{role}.yaml"));
        let probes: Vec<(String, String, String)> = probe
            .captures_iter(&text)
            .map(|c| (c[1].to_owned(), c[2].to_owned(), c[3].to_owned()))
            .collect();
        assert_eq!(probes.len(), 2, "{role}: a readiness and a liveness probe");
        for (kind, path, port) in probes {
            let expected = if kind == "readinessProbe" {
                "/readyz"
            } else {
                "/healthz"
            };
            assert_eq!(path, expected, "{role} {kind}");
            let served = match port.as_str() {
                "http" => {
                    assert_eq!(role, "api", "only the api role serves the API port");
                    &api
                }
                "metrics" => &telemetry,
                other => panic!("{role} {kind}: unknown port {other}"),
            };
            assert!(
                served.contains(&path),
                "{role} {kind}: {path} is not served on {port}"
            );
        }
    }
}

#[test]
fn every_env_name_is_one_keel_reads() {
    let tree = config_tree();
    let defaults = defaults();
    let values = values();
    let cli = read("crates/keel/src/cli/mod.rs");
    let mut sources: Vec<(String, String)> = templates();
    sources.push(("deploy/Containerfile".into(), read("deploy/Containerfile")));
    let mut checked = 0;
    for (file, text) in &sources {
        for name in keel_names(text) {
            checked += 1;
            if name.starts_with(keel::config::ENV_PREFIX) {
                let key = config_key(&tree, &name)
                    .unwrap_or_else(|| panic!("{file}: {name} names no configuration key"));
                assert!(
                    keel::config::is_known_key(&key),
                    "{file}: {name} -> `{key}` is not a key Keel's loader knows"
                );
            } else if name == "KEEL_ROLE" || name == "KEEL_CONFIG" {
                assert!(
                    cli.contains(&format!("env = \"{name}\"")),
                    "{file}: {name} is not read by the command line"
                );
            } else if name == defaults.operator.key_env || name == defaults.aa.sponsor_key_env {
            } else {
                panic!("{file}: {name} is neither a configuration key nor a variable Keel reads");
            }
        }
    }
    assert!(checked > 10, "only {checked} names found");
    // The key variables the chart names come from the configuration's defaults.
    assert_eq!(value(&values, "operator.keyEnv"), defaults.operator.key_env);
    assert_eq!(
        value(&values, "sponsor.keyEnv"),
        defaults.aa.sponsor_key_env
    );
    // The negative case: a misspelt key is refused.
    assert_eq!(config_key(&tree, "KEEL__API__LISTENADRESS"), None);
    assert_eq!(
        config_key(&tree, "KEEL__CHAINS__MAINNET__RPCURLS").as_deref(),
        Some("chains.mainnet.rpcUrls")
    );
}

#[test]
fn the_charts_environment_loads_as_a_configuration() {
    // Every KEEL__ variable the chart sets, with a value of its kind (the KMS variants
    // included): Keel's own loader accepts the lot and reads the ports from it.
    let values = values();
    let helpers = chart("templates/_helpers.tpl");
    let mut env = Vec::new();
    for name in keel_names(&helpers) {
        let sample = match name.rsplit("__").next().unwrap() {
            "LISTENADDRESS" => format!("0.0.0.0:{}", value(&values, "ports.api")),
            "METRICSADDRESS" => format!("0.0.0.0:{}", value(&values, "ports.metrics")),
            "URL" => "postgres://keel:secret@db:5432/keel".to_owned(),
            "KEYENV" => value(&values, "operator.keyEnv").to_owned(),
            "SPONSORKEYENV" => value(&values, "sponsor.keyEnv").to_owned(),
            "KIND" => "awsKms".to_owned(),
            "KEYID" => "alias/keel".to_owned(),
            "REGION" => "us-east-1".to_owned(),
            _ if !name.starts_with("KEEL__") => continue,
            other => panic!("no sample value for {name} ({other}): add one"),
        };
        env.push((name, sample));
    }
    for role in ROLES {
        let max = value(&values, &format!("{role}.databaseMaxConnections"));
        env.push(("KEEL__DATABASE__MAXCONNECTIONS".into(), max.to_owned()));
    }
    let config = Config::load_with_env(None, env.clone())
        .unwrap_or_else(|e| panic!("the chart's environment {env:?}: {e}"));
    assert_eq!(
        port_of(&config.api.listen_address).to_string(),
        value(&values, "ports.api")
    );
    assert_eq!(
        port_of(&config.telemetry.metrics_address).to_string(),
        value(&values, "ports.metrics")
    );
    assert!(
        config.operator.signer.is_some(),
        "KEEL__OPERATOR__SIGNER__* took effect"
    );
}

#[test]
fn termination_grace_and_its_pod_period_come_from_one_value() {
    let values = values();
    let margin: u64 = value(&values, "terminationGraceMarginSeconds")
        .parse()
        .unwrap();
    assert!(margin > 0, "the pod's period must outlast Keel's own grace");
    assert!(
        read("crates/keel/src/cli/mod.rs").contains("termination_grace_seconds: u64"),
        "keel run has --termination-grace-seconds"
    );
    let role_value = Regex::new(r"(?m)^\s*- name: KEEL_ROLE\s*\n\s*value: (\w+)").unwrap();
    for role in ROLES {
        let text = chart(&format!("templates/deployment-{role}.yaml"));
        let key = format!(".Values.{role}.terminationGraceSeconds");
        assert!(
            text.contains(&format!(
                r#"args: ["run", "--termination-grace-seconds", "{{{{ {key} }}}}"]"#
            )),
            "{role}: args run --termination-grace-seconds from {key}"
        );
        assert!(
            text.contains(&format!(
                "terminationGracePeriodSeconds: {{{{ add {key} .Values.terminationGraceMarginSeconds }}}}"
            )),
            "{role}: terminationGracePeriodSeconds from {key} plus the margin"
        );
        let grace: u64 = value(&values, &format!("{role}.terminationGraceSeconds"))
            .parse()
            .unwrap();
        assert!(grace > 0);
        let roles: Vec<&str> = role_value
            .captures_iter(&text)
            .map(|c| c.get(1).unwrap().as_str())
            .collect();
        assert_eq!(roles, vec![role], "{role}: KEEL_ROLE");
        let parsed: keel::config::Role =
            serde_json::from_value(serde_json::Value::String(role.to_owned())).unwrap();
        assert_eq!(parsed.as_str(), role);
        assert!(
            text.contains("kind: PodDisruptionBudget"),
            "{role}: a PodDisruptionBudget"
        );
    }
    let job = chart("templates/migrate-job.yaml");
    assert!(job.contains("helm.sh/hook: pre-install,pre-upgrade"));
    assert!(job.contains(r#"args: ["migrate"]"#));
    let containerfile = read("deploy/Containerfile");
    assert!(containerfile.contains(r#"ENTRYPOINT ["/keel"]"#));
    assert!(containerfile.contains(r#"CMD ["run"]"#));
    assert!(containerfile.contains("USER 65532:65532"));
}
