//! Domain identifiers and the PostgreSQL enums, as Rust types.
//!
//! Enums decode a value this binary does not know as `Unknown` instead of failing,
//! so a migration that adds a value can roll out before every binary knows it.

use std::fmt;

/// Declares a Rust enum mirroring a PostgreSQL enum type, with an `Unknown` variant
/// for values added after this binary was built.
macro_rules! pg_enum {
    ($(#[$meta:meta])* $name:ident, $pg:literal, { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant,)+
            /// A value added by a newer schema than this binary knows.
            Unknown,
        }

        impl $name {
            /// Every value this binary knows, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];

            /// The value's name in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                    $name::Unknown => "unknown",
                }
            }

            /// Parses a database name; unknown names give `Unknown`.
            pub fn from_db(text: &str) -> Self {
                match text {
                    $($text => $name::$variant,)+
                    _ => $name::Unknown,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl<'a> postgres_types::FromSql<'a> for $name {
            fn from_sql(
                _ty: &postgres_types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                Ok($name::from_db(std::str::from_utf8(raw)?))
            }

            fn accepts(ty: &postgres_types::Type) -> bool {
                ty.name() == $pg
            }
        }

        impl postgres_types::ToSql for $name {
            fn to_sql(
                &self,
                _ty: &postgres_types::Type,
                out: &mut postgres_types::private::BytesMut,
            ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                if *self == $name::Unknown {
                    return Err(concat!("cannot write an unknown ", $pg, " value").into());
                }
                out.extend_from_slice(self.as_str().as_bytes());
                Ok(postgres_types::IsNull::No)
            }

            fn accepts(ty: &postgres_types::Type) -> bool {
                ty.name() == $pg
            }

            postgres_types::to_sql_checked!();
        }
    };
}

pg_enum!(
    /// The life of an intent row: deletions go through `deleting` so they can be
    /// confirmed by the agent and reported back before the row is purged.
    RowState, "row_state", {
        Active => "active",
        Deleting => "deleting",
        Deleted => "deleted",
    }
);

pg_enum!(
    /// What an operation asks the agent to reconcile.
    ResourceType, "resource_type", {
        Application => "application",
        ManagedEnvironment => "managed_environment",
        RepositoryCredential => "repository_credential",
        SyncOperation => "sync_operation",
        Tenant => "tenant",
    }
);

pg_enum!(
    /// Where an operation is in the queue.
    OperationState, "operation_state", {
        Waiting => "waiting",
        Claimed => "claimed",
        Completed => "completed",
        Failed => "failed",
        Superseded => "superseded",
    }
);

pg_enum!(
    /// Whether Argo CD syncs on its own or only on request.
    SyncType, "sync_type", {
        Automated => "automated",
        Manual => "manual",
    }
);

pg_enum!(
    /// Progress of a tenant-requested sync.
    SyncOperationState, "sync_operation_state", {
        Pending => "pending",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Terminating => "terminating",
        Terminated => "terminated",
    }
);

pg_enum!(
    /// The families of wake-up signals (see `signal`).
    SignalKind, "signal_kind", {
        Operations => "operations",
        Status => "status",
    }
);

/// Declares an `i64` newtype id.
macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            postgres_types::ToSql, postgres_types::FromSql, serde::Serialize,
        )]
        #[postgres(transparent)]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// `operation.id`.
    OperationId
);
id_type!(
    /// `engine_instance.id`.
    EngineInstanceId
);
id_type!(
    /// `tenant.id`.
    TenantId
);
id_type!(
    /// `application.id`.
    ApplicationId
);
id_type!(
    /// `managed_environment.id`.
    ManagedEnvironmentId
);
id_type!(
    /// `repository_credential.id`.
    RepositoryCredentialId
);
id_type!(
    /// `sync_operation.id`.
    SyncOperationId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_names_round_trip_and_unknown_values_decode() {
        for state in OperationState::KNOWN {
            assert_eq!(OperationState::from_db(state.as_str()), *state);
        }
        assert_eq!(OperationState::from_db("paused"), OperationState::Unknown);
        assert_eq!(ResourceType::from_db("gateway"), ResourceType::Unknown);
    }
}
