//! `[operator]`: the account Keel sends transactions from.

use serde::{Deserialize, Serialize};

/// `[operator]`: the account Keel sends transactions from (role `runner`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorConfig {
    /// Name of the environment variable holding the operator's hex private key: the
    /// shorthand of `signer = { kind = "env", var = … }`, used when `signer` is absent.
    pub key_env: String,
    /// `[operator.signer]`: the operator key of any kind ([`crate::signer::SignerConfig`]);
    /// absent: `keyEnv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<crate::signer::SignerConfig>,
    /// ERC-8021 attribution codes (schema 0), appended to every calldata.
    pub attribution_codes: Vec<String>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            key_env: "KEEL_OPERATOR_KEY".to_owned(),
            signer: None,
            attribution_codes: vec!["keel".to_owned()],
        }
    }
}

impl OperatorConfig {
    /// The operator key's configuration and the configuration key it comes from
    /// (`operator.signer`, or `operator.keyEnv` when no signer table is given).
    pub fn signer_config(&self) -> (crate::signer::SignerConfig, &'static str) {
        match &self.signer {
            Some(s) => (s.clone(), "operator.signer"),
            None => (
                crate::signer::SignerConfig::Env {
                    var: self.key_env.clone(),
                },
                "operator.keyEnv",
            ),
        }
    }
}
