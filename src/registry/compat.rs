//! Compatibility levels of the Confluent Schema Registry, checked with
//! apache-avro's `SchemaCompatibility` (not a home-made checker).

use std::fmt;
use std::str::FromStr;

use apache_avro::schema_compatibility::{Compatibility, SchemaCompatibility};
use apache_avro::Schema;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    None,
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
}

/// The event log is read from the start by replays, so old events must stay
/// readable forever: the default is `BACKWARD_TRANSITIVE`.
pub const DEFAULT_LEVEL: Level = Level::BackwardTransitive;

impl Level {
    pub const fn as_str(self) -> &'static str {
        match self {
            Level::None => "NONE",
            Level::Backward => "BACKWARD",
            Level::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Level::Forward => "FORWARD",
            Level::ForwardTransitive => "FORWARD_TRANSITIVE",
            Level::Full => "FULL",
            Level::FullTransitive => "FULL_TRANSITIVE",
        }
    }

    fn transitive(self) -> bool {
        matches!(
            self,
            Level::BackwardTransitive | Level::ForwardTransitive | Level::FullTransitive
        )
    }

    fn backward(self) -> bool {
        matches!(
            self,
            Level::Backward | Level::BackwardTransitive | Level::Full | Level::FullTransitive
        )
    }

    fn forward(self) -> bool {
        matches!(
            self,
            Level::Forward | Level::ForwardTransitive | Level::Full | Level::FullTransitive
        )
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "NONE" => Level::None,
            "BACKWARD" => Level::Backward,
            "BACKWARD_TRANSITIVE" => Level::BackwardTransitive,
            "FORWARD" => Level::Forward,
            "FORWARD_TRANSITIVE" => Level::ForwardTransitive,
            "FULL" => Level::Full,
            "FULL_TRANSITIVE" => Level::FullTransitive,
            _ => return Err(format!("Invalid compatibility level: {s}")),
        })
    }
}

/// Checks `new` against earlier versions (oldest first) at `level`; returns
/// one message per problem found, empty when compatible. A non-transitive
/// level only looks at the latest version.
pub fn check(level: Level, new: &Schema, earlier: &[(i32, Schema)]) -> Vec<String> {
    if level == Level::None || earlier.is_empty() {
        return Vec::new();
    }
    let against: &[(i32, Schema)] = if level.transitive() {
        earlier
    } else {
        &earlier[earlier.len() - 1..]
    };
    let mut problems = Vec::new();
    for (version, old) in against {
        if level.backward() {
            // BACKWARD: consumers on the new schema read data written with the old.
            if let Some(why) = readable(old, new) {
                problems.push(format!(
                    "{{compatibility: '{level}', oldSchemaVersion: {version}, direction: 'new schema reading old data', description: '{why}'}}"
                ));
            }
        }
        if level.forward() {
            // FORWARD: consumers on the old schema read data written with the new.
            if let Some(why) = readable(new, old) {
                problems.push(format!(
                    "{{compatibility: '{level}', oldSchemaVersion: {version}, direction: 'old schema reading new data', description: '{why}'}}"
                ));
            }
        }
    }
    problems
}

/// `None` when `reader` can read everything written with `writer`.
fn readable(writer: &Schema, reader: &Schema) -> Option<String> {
    match SchemaCompatibility::can_read(writer, reader) {
        Ok(Compatibility::Full) => None,
        // Some union branches of the writer cannot be read: incompatible.
        Ok(Compatibility::Partial) => {
            let mut why = Vec::new();
            explain_partial(writer, reader, "", &mut why);
            if why.is_empty() {
                why.push("some union branches of the writer schema cannot be read".into());
            }
            Some(why.join("; "))
        }
        Err(e) => Some(describe(&e)),
    }
}

/// Finds which union branches make a `Partial` verdict, walking records by
/// field name and unions by branch name, so the message names the problem.
fn explain_partial(writer: &Schema, reader: &Schema, path: &str, out: &mut Vec<String>) {
    match (writer, reader) {
        (Schema::Record(w), Schema::Record(r)) => {
            for wf in &w.fields {
                if let Some(rf) = r.fields.iter().find(|f| f.name == wf.name) {
                    explain_partial(&wf.schema, &rf.schema, &format!("{path}/{}", wf.name), out);
                }
            }
        }
        (Schema::Union(w), Schema::Union(r)) => {
            for branch in w.variants() {
                let name = branch_name(branch);
                match r.variants().iter().find(|b| branch_name(b) == name) {
                    None => out.push(format!(
                        "union branch '{name}' at {path} is missing from the reader schema"
                    )),
                    Some(rb) => match SchemaCompatibility::can_read(branch, rb) {
                        Ok(Compatibility::Full) => {}
                        Ok(Compatibility::Partial) => {
                            explain_partial(branch, rb, &format!("{path}/{name}"), out)
                        }
                        Err(e) => out.push(format!("{path}/{name}: {}", describe(&e))),
                    },
                }
            }
        }
        _ => {}
    }
}

fn branch_name(schema: &Schema) -> String {
    match schema {
        Schema::Record(r) => r.name.fullname(None),
        Schema::Enum(e) => e.name.fullname(None),
        Schema::Fixed(f) => f.name.fullname(None),
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)),
    }
}

fn describe(e: &apache_avro::error::CompatibilityError) -> String {
    use std::error::Error;
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.replace('\'', "\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: &str) -> Schema {
        Schema::parse_str(&format!(
            r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn adding_field_with_default_is_backward_compatible() {
        let v1 = schema(r#"{"name":"a","type":"long"}"#);
        let v2 = schema(r#"{"name":"a","type":"long"},{"name":"b","type":"string","default":""}"#);
        assert!(check(Level::BackwardTransitive, &v2, &[(1, v1.clone())]).is_empty());
        assert!(check(Level::FullTransitive, &v2, &[(1, v1)]).is_empty());
    }

    #[test]
    fn adding_field_without_default_is_refused_and_named() {
        let v1 = schema(r#"{"name":"a","type":"long"}"#);
        let v2 = schema(r#"{"name":"a","type":"long"},{"name":"b","type":"string"}"#);
        let problems = check(Level::Backward, &v2, &[(1, v1.clone())]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("\"b\""), "{problems:?}");
        // Forward only: old readers ignore the new field.
        assert!(check(Level::Forward, &v2, &[(1, v1)]).is_empty());
    }

    #[test]
    fn removing_field_without_default_breaks_forward() {
        let v1 = schema(r#"{"name":"a","type":"long"},{"name":"b","type":"long"}"#);
        let v2 = schema(r#"{"name":"a","type":"long"}"#);
        assert!(check(Level::Backward, &v2, &[(1, v1.clone())]).is_empty());
        let problems = check(Level::Forward, &v2, &[(1, v1)]);
        assert!(problems.iter().any(|p| p.contains("\"b\"")), "{problems:?}");
    }

    #[test]
    fn transitive_checks_every_version() {
        let v1 = schema(r#"{"name":"a","type":"long"}"#);
        let v2 = schema(r#"{"name":"b","type":"long","default":0}"#);
        let v3 = schema(r#"{"name":"b","type":"long"}"#);
        let earlier = [(1, v1), (2, v2)];
        // Against the latest only (v2, where b has a default): fine.
        assert!(check(Level::Backward, &v3, &earlier).is_empty());
        // Against every version: v1 data has no b and v3 gives it no default.
        let problems = check(Level::BackwardTransitive, &v3, &earlier);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("oldSchemaVersion: 1"), "{problems:?}");
    }

    #[test]
    fn levels_parse_and_print() {
        for l in [
            Level::None,
            Level::Backward,
            Level::BackwardTransitive,
            Level::Forward,
            Level::ForwardTransitive,
            Level::Full,
            Level::FullTransitive,
        ] {
            assert_eq!(l.as_str().parse::<Level>().unwrap(), l);
        }
        assert!("SIDEWAYS".parse::<Level>().is_err());
    }
}
