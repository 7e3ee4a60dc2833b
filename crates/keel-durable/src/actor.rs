//! Who asked for a command: the actor every recorded command carries (issue 23).
//!
//! An [`Actor`] is taken **once, when the command is recorded**, from the recording
//! caller's authenticated context: the API key that called (a [`ActorKind::Service`],
//! or a [`ActorKind::User`] when the key was issued to a named person), the engine or a
//! runner of the platform ([`ActorKind::System`] with a reason such as `timer`,
//! `settlement`, `recovery`), or nothing ([`ActorKind::None`], status
//! [`AttributionStatus::Absent`]). It is **never** read from a start input, a signal
//! payload or a header an integrator controls: the engine's recording calls take it as
//! a separate argument ([`crate::StartOptions::actor`], [`crate::Engine::signal_as`],
//! [`crate::Engine::cancel_as`], [`crate::Engine::retry_as`]) and the calls without it
//! record [`Actor::none`].
//!
//! Ids and reasons are bounded before they are stored ([`sanitize`]): control
//! characters, the line and paragraph separators U+2028/U+2029 and Unicode format
//! characters (bidirectional overrides and isolates, zero-width characters, the BOM) are
//! removed, then the text is cut at 255 characters; an id or reason of which nothing is
//! left is stored as [`UNPRINTABLE`], so a verified user or service is never recorded
//! without an id.
//!
//! Stored in the five `actor_*` / `on_behalf_of` / `attribution_status` columns of
//! `durable_command` and `durable_signal` (migration 0055); rows written before it read
//! as [`Actor::none`].

use serde::{Deserialize, Serialize};

/// The most characters (Unicode scalar values) an actor id, reason or subject keeps.
pub const MAX_ACTOR_CHARS: usize = 255;

/// What an id or reason of which sanitizing left nothing is stored as.
pub const UNPRINTABLE: &str = "[unprintable]";

/// Who recorded a command, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActorKind {
    /// A named person (an API key issued to a person); `id` is that person's id.
    User,
    /// A service principal (an API key); `id` is the key's id.
    Service,
    /// The platform itself (the engine, a runner, a relay); `reason` says which, no id.
    System,
    /// Nobody known: no authenticated context when the command was recorded (also every
    /// command recorded before actors were).
    None,
}

impl ActorKind {
    /// The stored and wire name: `USER`, `SERVICE`, `SYSTEM`, `NONE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "USER",
            Self::Service => "SERVICE",
            Self::System => "SYSTEM",
            Self::None => "NONE",
        }
    }

    /// Parses [`ActorKind::as_str`]; `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "USER" => Self::User,
            "SERVICE" => Self::Service,
            "SYSTEM" => Self::System,
            "NONE" => Self::None,
            _ => return None,
        })
    }
}

/// How far the recorded actor can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AttributionStatus {
    /// Taken from an authenticated context (or the platform itself).
    Verified,
    /// No context: the actor is [`ActorKind::None`].
    Absent,
    /// Taken from a context its source marked as degraded (for example an identity that
    /// could not be re-verified); the kind and id are as the context said.
    Degraded,
}

impl AttributionStatus {
    /// The stored and wire name: `VERIFIED`, `ABSENT`, `DEGRADED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "VERIFIED",
            Self::Absent => "ABSENT",
            Self::Degraded => "DEGRADED",
        }
    }

    /// Parses [`AttributionStatus::as_str`]; `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "VERIFIED" => Self::Verified,
            "ABSENT" => Self::Absent,
            "DEGRADED" => Self::Degraded,
            _ => return None,
        })
    }
}

/// Who asked for a command. Build it with [`Actor::user`], [`Actor::service`],
/// [`Actor::system`] or [`Actor::none`] (the constructors sanitize); the fields are
/// read-only so that an actor is always well formed: `USER`/`SERVICE` have an id,
/// `SYSTEM` a reason and no id, `NONE` nothing and status `ABSENT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    kind: ActorKind,
    id: Option<String>,
    reason: Option<String>,
    on_behalf_of: Option<String>,
    status: AttributionStatus,
}

impl Default for Actor {
    fn default() -> Self {
        Self::none()
    }
}

impl Actor {
    /// A named person, verified.
    pub fn user(id: &str) -> Self {
        Self {
            kind: ActorKind::User,
            id: Some(sanitize(id)),
            reason: None,
            on_behalf_of: None,
            status: AttributionStatus::Verified,
        }
    }

    /// A service principal (an API key), verified.
    pub fn service(id: &str) -> Self {
        Self {
            kind: ActorKind::Service,
            id: Some(sanitize(id)),
            reason: None,
            on_behalf_of: None,
            status: AttributionStatus::Verified,
        }
    }

    /// The platform, for `reason` (`timer`, `settlement`, `recovery`, `child-start`,
    /// `child-ended`, `retention`, ...), verified, no id.
    pub fn system(reason: &str) -> Self {
        Self {
            kind: ActorKind::System,
            id: None,
            reason: Some(sanitize(reason)),
            on_behalf_of: None,
            status: AttributionStatus::Verified,
        }
    }

    /// Nobody known (no authenticated context): `NONE`, `ABSENT`.
    pub fn none() -> Self {
        Self {
            kind: ActorKind::None,
            id: None,
            reason: None,
            on_behalf_of: None,
            status: AttributionStatus::Absent,
        }
    }

    /// This actor acting for `subject` (a principal id, never a claim or a token), when
    /// it differs from the actor's id; ignored for [`ActorKind::None`].
    #[must_use]
    pub fn on_behalf_of(mut self, subject: &str) -> Self {
        if self.kind != ActorKind::None {
            let s = sanitize(subject);
            if self.id.as_deref() != Some(s.as_str()) {
                self.on_behalf_of = Some(s);
            }
        }
        self
    }

    /// This actor, taken from a context its source marked as degraded
    /// ([`AttributionStatus::Degraded`]); ignored for [`ActorKind::None`].
    #[must_use]
    pub fn degraded(mut self) -> Self {
        if self.kind != ActorKind::None {
            self.status = AttributionStatus::Degraded;
        }
        self
    }

    /// With a reason (what the actor said it does, sanitized), for any kind but `NONE`.
    #[must_use]
    pub fn with_reason(mut self, reason: &str) -> Self {
        if self.kind != ActorKind::None {
            self.reason = Some(sanitize(reason));
        }
        self
    }

    /// The kind.
    pub fn kind(&self) -> ActorKind {
        self.kind
    }

    /// The id (`USER`: the person, `SERVICE`: the key); `None` for `SYSTEM` and `NONE`.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The reason (`SYSTEM`: which part of the platform), if any.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The subject this actor acted for, if it differs from the actor.
    pub fn on_behalf_of_id(&self) -> Option<&str> {
        self.on_behalf_of.as_deref()
    }

    /// The attribution status.
    pub fn status(&self) -> AttributionStatus {
        self.status
    }

    /// Decodes the stored columns. Unknown kinds or statuses, or a row that breaks the
    /// shape rules, read as [`Actor::none`] (the table's CHECKs prevent both).
    pub(crate) fn from_columns(
        kind: &str,
        id: Option<String>,
        reason: Option<String>,
        on_behalf_of: Option<String>,
        status: &str,
    ) -> Self {
        match (ActorKind::parse(kind), AttributionStatus::parse(status)) {
            (Some(ActorKind::None), _) | (None, _) | (_, None) => Self::none(),
            (Some(kind), Some(status)) => Self {
                kind,
                id,
                reason,
                on_behalf_of,
                status,
            },
        }
    }
}

/// A recorded command and who recorded it ([`crate::Engine::attribution`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCommand {
    /// The command's id (its position in the instance's queue).
    pub id: i64,
    /// `start`, `signal`, `timer`, `retry` or `cancel`.
    pub kind: String,
    /// `queued`, `running`, `done` or `dead`.
    pub state: String,
    /// The value-free outcome code of a settled command (`completed`, `waiting`,
    /// `cancelled`, `stale`, ...).
    pub outcome: Option<String>,
    /// When it was recorded (database clock).
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    /// Who recorded it.
    pub actor: Actor,
}

/// A recorded signal and who recorded it ([`crate::Engine::attribution`]); never its
/// payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedSignal {
    /// The signal's id.
    pub id: i64,
    /// Its name (1 to 255 characters).
    pub name: String,
    /// Its dedupe key.
    pub dedupe_key: String,
    /// When it was recorded (database clock).
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    /// Whether a wait consumed it.
    pub consumed: bool,
    /// Who recorded it.
    pub actor: Actor,
}

/// Who recorded what for one instance: commands and signals, each in recording order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attribution {
    /// The instance's commands (START first).
    pub commands: Vec<RecordedCommand>,
    /// The instance's signals.
    pub signals: Vec<RecordedSignal>,
}

impl Attribution {
    /// The START command, if retention has not removed it (it does not while the
    /// instance exists).
    pub fn start(&self) -> Option<&RecordedCommand> {
        self.commands.iter().find(|c| c.kind == "start")
    }

    /// The last CANCEL command, if any.
    pub fn cancel(&self) -> Option<&RecordedCommand> {
        self.commands.iter().rev().find(|c| c.kind == "cancel")
    }

    /// The first signal recorded with `dedupe_key`, if any (dedupe keys are unique per
    /// instance).
    pub fn signal(&self, dedupe_key: &str) -> Option<&RecordedSignal> {
        self.signals.iter().find(|s| s.dedupe_key == dedupe_key)
    }
}

/// Whether `c` is removed from actor ids and reasons: control characters (Cc), the line
/// and paragraph separators (Zl, Zp: U+2028, U+2029) and the format characters (Cf:
/// bidirectional marks, embeddings, overrides and isolates, zero-width space / joiners,
/// word joiner, invisible operators, BOM, soft hyphen, interlinear annotation and
/// tag characters, ...).
fn removed(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}' | '\u{0600}'..='\u{0605}' | '\u{061C}' | '\u{06DD}' | '\u{070F}'
            | '\u{0890}'..='\u{0891}' | '\u{08E2}' | '\u{180E}'
            | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}' | '\u{110CD}' | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}' | '\u{E0020}'..='\u{E007F}')
}

/// An actor id or reason as it is stored: without control, separator and format
/// characters, cut at [`MAX_ACTOR_CHARS`] characters, and [`UNPRINTABLE`] when nothing
/// (or only whitespace) is left.
pub fn sanitize(s: &str) -> String {
    let kept: String = s
        .chars()
        .filter(|c| !removed(*c))
        .take(MAX_ACTOR_CHARS)
        .collect();
    if kept.trim().is_empty() {
        UNPRINTABLE.to_owned()
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_strips_control_bidi_and_zero_width() {
        assert_eq!(sanitize("ali\u{202E}ce\u{200B}\n\t\u{0007}"), "alice");
        assert_eq!(
            sanitize("a\u{2028}b\u{2029}c\u{FEFF}d\u{2066}e\u{2069}"),
            "abcde"
        );
        assert_eq!(sanitize("\u{200D}\u{200C}\u{0000}"), UNPRINTABLE);
        assert_eq!(sanitize(""), UNPRINTABLE);
        assert_eq!(sanitize("  \u{200B} "), UNPRINTABLE);
        assert_eq!(sanitize("émile 東京"), "émile 東京");
    }

    #[test]
    fn sanitize_cuts_at_255_characters_not_bytes() {
        let long = "é".repeat(300);
        let cut = sanitize(&long);
        assert_eq!(cut.chars().count(), MAX_ACTOR_CHARS);
        // Removed characters do not count toward the bound.
        let padded = format!("{}{}", "\u{200B}".repeat(300), "x".repeat(10));
        assert_eq!(sanitize(&padded), "x".repeat(10));
    }

    #[test]
    fn actor_shapes_hold() {
        let s = Actor::service("\u{202E}key");
        assert_eq!(s.kind(), ActorKind::Service);
        assert_eq!(s.id(), Some("key"));
        assert_eq!(s.status(), AttributionStatus::Verified);
        let t = Actor::system("timer");
        assert_eq!((t.id(), t.reason()), (None, Some("timer")));
        let n = Actor::none().degraded().on_behalf_of("x").with_reason("y");
        assert_eq!(n, Actor::none());
        let d = Actor::user("u1").on_behalf_of("u1").degraded();
        assert_eq!(d.on_behalf_of_id(), None);
        assert_eq!(d.status(), AttributionStatus::Degraded);
        assert_eq!(Actor::user("").id(), Some(UNPRINTABLE));
        assert_eq!(
            Actor::from_columns("WHAT", Some("x".into()), None, None, "VERIFIED"),
            Actor::none()
        );
    }
}
