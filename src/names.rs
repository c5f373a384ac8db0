//! Names that become identifiers in other systems, checked once here for
//! every floor: tenant ids (in Redis keys, Kafka keys, channel names),
//! database names (quoted into DDL) and the prefixes of the month tables
//! (the store makes them; the exactness check recognises them).

/// Prefix of every group month table.
pub const TABLE_PREFIX: &str = "im_group_messages_";
/// Prefix of every one-to-one month table.
pub const P2P_TABLE_PREFIX: &str = "im_p2p_messages_";

/// Checks a tenant id: 1–32 characters of `[a-z0-9_]`. Tenant ids appear in
/// Redis keys, Kafka keys and channel names, so they are kept plain.
pub fn validate_tenant_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 32 {
        return Err("must be 1 to 32 characters".into());
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("may contain only a-z, 0-9 and _".into());
    }
    Ok(())
}

/// Checks a database name: 1–64 characters of `[A-Za-z0-9_]`, so it can be
/// quoted into DDL safely.
pub fn validate_database_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err("may contain only A-Z, a-z, 0-9 and _".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids() {
        assert!(validate_tenant_id("acme_01").is_ok());
        assert!(validate_tenant_id("").is_err());
        assert!(validate_tenant_id("Acme").is_err());
        assert!(validate_tenant_id("a:b").is_err());
        assert!(validate_tenant_id(&"a".repeat(33)).is_err());
    }

    #[test]
    fn database_names() {
        assert!(validate_database_name("im_tenant_acme").is_ok());
        assert!(validate_database_name("x`; DROP").is_err());
        assert!(validate_database_name("").is_err());
    }
}
