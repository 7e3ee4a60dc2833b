//! Loading: the defaults, a file, then `KEEL__SECTION__KEY` environment overrides matched
//! case-insensitively to the camelCase keys.

use super::{Config, ConfigError, invalid};
use super::{DEFAULT_TOML, ENV_PREFIX};
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use std::path::Path;

/// Key paths of the default configuration, for matching environment variables (which
/// are case-insensitive) to the camelCase keys.
pub(super) fn known_paths() -> Vec<Vec<String>> {
    fn walk(prefix: &[String], table: &toml::Table, out: &mut Vec<Vec<String>>) {
        for (k, v) in table {
            let mut path = prefix.to_vec();
            path.push(k.clone());
            if let toml::Value::Table(t) = v {
                walk(&path, t, out);
            }
            out.push(path);
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = DEFAULT_TOML.parse::<toml::Table>() {
        walk(&[], &table, &mut out);
    }
    // Keys that are optional and commented out in the defaults.
    out.push(vec!["role".to_owned()]);
    for key in [
        "chainId",
        "rpcUrls",
        "confirmations",
        "finalityDepth",
        "wsUrl",
        "custody",
        "senders",
        "profile",
        "fees",
        "maxGasPerTransaction",
        "bumpPercent",
        "bumpAfterMs",
        "indexFinalityDepth",
        "subscribe",
    ] {
        out.push(vec!["chains".to_owned(), "*".to_owned(), key.to_owned()]);
    }
    for key in [
        "model",
        "baseFeeMultiplierPercent",
        "priorityFee",
        "minPriorityFeeWei",
        "feeHistoryBlocks",
        "feeHistoryPercentile",
        "gasPriceMultiplierPercent",
        "l1DataFee",
        "l1FeeOracle",
        "l1FeeMultiplierPercent",
    ] {
        out.push(
            ["chains", "*", "fees", key]
                .into_iter()
                .map(str::to_owned)
                .collect(),
        );
    }
    // `[aa.sponsorship]` policies (optional tables, commented out in the defaults).
    for table in [
        vec!["aa", "sponsorship", "default"],
        vec!["aa", "sponsorship", "organizations", "*"],
    ] {
        let table: Vec<String> = table.into_iter().map(str::to_owned).collect();
        for key in [
            "accounts",
            "targets",
            "maxGasPerOperation",
            "dailyBudgetWei",
        ] {
            let mut path = table.clone();
            path.push(key.to_owned());
            out.push(path);
        }
        out.push(table);
    }
    out.extend(custody_paths());
    // Signer tables (`[operator.signer]`, `[aa.sponsorSigner]`, a chain's
    // `[chains.<name>.senders.<sender>]`), optional.
    for table in [
        vec!["operator", "signer"],
        vec!["aa", "sponsorSigner"],
        vec!["chains", "*", "senders", "*"],
    ] {
        let table: Vec<String> = table.into_iter().map(str::to_owned).collect();
        for key in crate::signer::SIGNER_KEYS {
            let mut path = table.clone();
            path.push((*key).to_owned());
            out.push(path);
        }
        out.push(table);
    }
    out
}

/// The optional custody keys (`chains.<name>.custody.…`, `custody.…`), for environment
/// overrides; a vault's name is any segment (`*`).
pub(super) fn custody_paths() -> Vec<Vec<String>> {
    let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut out = vec![path(&["custody"]), path(&["custody", "webhookJwksUrl"])];
    for key in [
        "provider",
        "baseUrl",
        "apiKey",
        "privateKey",
        "requestsPerSecond",
        "burst",
        "requestTimeoutMs",
        "vaults",
    ] {
        out.push(path(&["chains", "*", "custody", key]));
    }
    for key in [
        "vaultAccountId",
        "assetId",
        "address",
        "pollIntervalMs",
        "maxPollIntervalMs",
        "pollBudgetSecs",
        "silentDropAfterSecs",
        "clockSkewSecs",
    ] {
        out.push(path(&["chains", "*", "custody", "vaults", "*", key]));
    }
    out
}

/// Whether `key` (dotted, e.g. `durable.executor.pollIntervalMs`) names a key or
/// section of the configuration; any name is accepted for a chain (`chains.<name>.…`).
pub fn is_known_key(key: &str) -> bool {
    let segments: Vec<&str> = key.split('.').collect();
    let mut known = known_paths();
    known.push(vec!["chains".to_owned(), "*".to_owned()]);
    known.iter().any(|path| {
        path.len() == segments.len()
            && path.iter().zip(&segments).enumerate().all(|(i, (k, s))| {
                k == s
                    || (k == "*" && !s.is_empty())
                    || (i == 1 && path[0] == "chains" && !s.is_empty())
            })
    })
}

/// An environment value as TOML when it parses as one (`500`, `true`,
/// `["http://a", "http://b"]`, `"quoted"`), else as the plain string; an address
/// (`0x` + 40 hex digits) is always the string.
pub(super) fn env_value(raw: &str) -> toml::Value {
    // An address (`0x` + 40 hex digits) is text, though TOML reads a small one as a
    // hex integer.
    if raw.len() == 42 && raw.starts_with("0x") && raw[2..].bytes().all(|b| b.is_ascii_hexdigit()) {
        return toml::Value::String(raw.to_owned());
    }
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Maps an environment key (`durable.confirmationwatcher.intervalms`, already split on
/// `__` and lowercased) to its canonical camelCase path, segment by segment; segments
/// without a known spelling (a chain's name) are kept as written.
pub(super) fn canonical_key(lower: &str, known: &[Vec<String>]) -> String {
    let mut out: Vec<String> = Vec::new();
    for segment in lower.split('.') {
        let depth = out.len();
        let matched = known.iter().find_map(|path| {
            let prefix_ok = path.len() > depth
                && path[..depth]
                    .iter()
                    .zip(&out)
                    .all(|(k, o)| k == "*" || k == o);
            (prefix_ok && path[depth].eq_ignore_ascii_case(segment) && path[depth] != "*")
                .then(|| path[depth].clone())
        });
        out.push(matched.unwrap_or_else(|| segment.to_owned()));
    }
    out.join(".")
}

impl Config {
    /// Loads defaults, then `file` when given, then `KEEL__…` variables from the
    /// process environment, and validates the result.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// [`Config::load`] with an explicit environment (tests).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key.
    pub fn load_with_env(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(invalid("--config", "file does not exist"));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let known = known_paths();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let key = canonical_key(&rest.to_ascii_lowercase().replace("__", "."), &known);
            figment = figment.merge(Serialized::default(&key, env_value(&value)));
        }
        let config: Config = figment.extract().map_err(|e| {
            let key = if e.path.is_empty() {
                "<root>".to_owned()
            } else {
                e.path.join(".")
            };
            let reason = match &e.kind {
                figment::error::Kind::UnknownField(field, _) => format!("unknown key `{field}`"),
                figment::error::Kind::MissingField(field) => format!("missing key `{field}`"),
                figment::error::Kind::InvalidType(actual, expected) => {
                    format!(
                        "expected {expected}, found {}",
                        actual.to_string().split(' ').next().unwrap_or("value")
                    )
                }
                figment::error::Kind::InvalidValue(_, expected) => format!("expected {expected}"),
                figment::error::Kind::UnknownVariant(_, expected) => {
                    format!("expected one of {}", expected.join(", "))
                }
                _ => "invalid value".to_owned(),
            };
            ConfigError::Parse { key, reason }
        })?;
        config.validate()?;
        Ok(config)
    }
}
