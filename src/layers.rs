//! The floors of `crate::FLOORS`, checked: every `crate::…` path in the
//! code under `src/` (in `use` lines and written out inline; comments are
//! not code) must name a module of the importer's floor or one below. A
//! path that runs up a floor fails the test, named with its file and line,
//! as does a top-level module that is on no floor or on two.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::FLOORS;

/// One `crate::<module>` path found in a file.
#[derive(Debug, PartialEq, Eq)]
struct Import {
    line: usize,
    module: String,
}

/// The modules every `crate::` path of `source` starts with, and those a
/// `super::` chain reaches when it climbs out of the file's top-level
/// module (`depth`: how many modules deep the file is, `src/a/b.rs` is 2,
/// `src/a/mod.rs` 1). `super::` is resolved only before the file's tests
/// (`#[cfg(test)]`), whose inline module adds a level.
fn imports(source: &str, depth: usize) -> Vec<Import> {
    let code: Vec<String> = source.lines().map(code_of).collect();
    let mut out = Vec::new();
    let mut in_tests = false;
    for (i, line) in code.iter().enumerate() {
        in_tests |= source
            .lines()
            .nth(i)
            .is_some_and(|l| l.trim() == "#[cfg(test)]");
        for (prefix, climbs) in [("crate::", 0), ("super::", 1)] {
            if prefix == "super::" && (in_tests || depth == 0) {
                continue;
            }
            let mut rest = line.as_str();
            while let Some(at) = rest.find(prefix) {
                let preceded = rest[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
                rest = &rest[at + prefix.len()..];
                if preceded {
                    // `imstream_crate::`, `a::super::`: not a path's start.
                    continue;
                }
                let mut up = climbs;
                while climbs > 0 && rest.starts_with(prefix) {
                    rest = &rest[prefix.len()..];
                    up += 1;
                }
                if climbs > 0 && up < depth {
                    continue; // stays inside the file's top-level module
                }
                for module in first_segments(rest, &code, i) {
                    out.push(Import {
                        line: i + 1,
                        module,
                    });
                }
            }
        }
    }
    out
}

/// A line without its comment and the insides of its string literals (so
/// `"http://…"` neither ends the line nor hides a path after it, and a
/// path written in a string is not code).
fn code_of(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                in_str = true;
                out.push('"');
            }
            // A char literal holding a quote (`'"'`) does not open a string.
            '\'' if line_has_char_quote(&mut chars) => out.push_str("'\"'"),
            _ => out.push(c),
        }
    }
    out
}

/// After a `'`: consumes `"'` when the literal is `'"'`.
fn line_has_char_quote(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> bool {
    let mut ahead = chars.clone();
    if ahead.next() == Some('"') && ahead.next() == Some('\'') {
        chars.next();
        chars.next();
        return true;
    }
    false
}

/// The first segment of the path that starts at `rest`, or of each path
/// in a `{…}` group (which may run over several lines of `code`).
fn first_segments(rest: &str, code: &[String], line: usize) -> Vec<String> {
    if !rest.starts_with('{') {
        return ident(rest).into_iter().collect();
    }
    // The group as text, from this line on, up to its closing brace.
    let mut text = rest.to_string();
    for next in code.iter().skip(line + 1) {
        if balanced(&text) {
            break;
        }
        text.push(' ');
        text.push_str(next);
    }
    let mut depth = 0;
    let mut segments = Vec::new();
    let mut item_start = true;
    for (at, c) in text.char_indices() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    item_start = true;
                    continue;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                item_start = true;
                continue;
            }
            _ => {}
        }
        if depth == 1 && item_start && !c.is_whitespace() {
            item_start = false;
            segments.extend(ident(&text[at..]));
        }
    }
    segments
}

fn balanced(text: &str) -> bool {
    text.matches('{').count() <= text.matches('}').count()
}

fn ident(text: &str) -> Option<String> {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    (end > 0).then(|| text[..end].to_string())
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The top-level module a file of `src/` belongs to (`None` for the crate
/// root and the binary).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// How many modules deep a file of `src/` is: `a.rs` and `a/mod.rs` 1,
/// `a/b.rs` 2.
fn depth_of(src: &Path, file: &Path) -> usize {
    let parts = file.strip_prefix(src).map_or(0, |p| p.components().count());
    if file.file_name().is_some_and(|n| n == "mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// What the crate root itself defines (not a module): `crate::run`,
/// `crate::FLOORS`. Any other root path would be a re-export that hides
/// which floor it comes from.
const ROOT_ITEMS: &[&str] = &["run", "FLOORS"];

fn floor_of() -> BTreeMap<&'static str, (usize, &'static str)> {
    let mut floors = BTreeMap::new();
    for (level, (floor, modules)) in FLOORS.iter().enumerate() {
        for m in modules.iter() {
            let before = floors.insert(*m, (level, *floor));
            assert!(before.is_none(), "module `{m}` is on two floors");
        }
    }
    floors
}

#[test]
fn every_module_is_on_one_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors = floor_of();
    let modules: std::collections::BTreeSet<String> = sources(&src)
        .iter()
        .filter_map(|f| module_of(&src, f))
        .collect();
    let missing: Vec<&String> = modules
        .iter()
        .filter(|m| !floors.contains_key(m.as_str()) && m.as_str() != "layers")
        .collect();
    assert!(
        missing.is_empty(),
        "modules on no floor (add them to crate::FLOORS): {missing:?}"
    );
    let gone: Vec<&&str> = floors.keys().filter(|m| !modules.contains(**m)).collect();
    assert!(
        gone.is_empty(),
        "crate::FLOORS names modules src/ does not have: {gone:?}"
    );
}

#[test]
fn no_import_runs_up_a_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors = floor_of();
    let mut up = Vec::new();
    for file in sources(&src) {
        let Some(module) = module_of(&src, &file) else {
            continue;
        };
        let Some(&(level, floor)) = floors.get(module.as_str()) else {
            continue; // every_module_is_on_one_floor names it
        };
        let text = std::fs::read_to_string(&file).expect("read source");
        for import in imports(&text, depth_of(&src, &file)) {
            let Some(&(their_level, their_floor)) = floors.get(import.module.as_str()) else {
                if !ROOT_ITEMS.contains(&import.module.as_str()) && import.module != "layers" {
                    up.push(format!(
                        "{}:{}: `{module}` names `crate::{}`, on no floor",
                        file.strip_prefix(&src).unwrap_or(&file).display(),
                        import.line,
                        import.module,
                    ));
                }
                continue;
            };
            if their_level > level {
                up.push(format!(
                    "{}:{}: `{module}` ({floor}) imports `{}` ({their_floor})",
                    file.strip_prefix(&src).unwrap_or(&file).display(),
                    import.line,
                    import.module,
                ));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports that run up a floor:\n{}",
        up.join("\n")
    );
}

#[test]
fn paths_are_read_from_use_lines_groups_and_inline_code() {
    let source = "use crate::keys::TopicKeys;\n\
                  use crate::{\n    store::month,\n    history::{self, Page},\n};\n\
                  // crate::gateway in a comment is not code\n\
                  let x = crate::send::CLAIM; let y = imstream_crate::z;\n\
                  let u = \"http://host/crate::bench\"; crate::search::f();\n\
                  use super::super::relations::X; use super::sibling;\n\
                  #[cfg(test)]\n\
                  use super::super::super::cli::Y;\n";
    let found: Vec<(usize, String)> = imports(source, 2)
        .into_iter()
        .map(|i| (i.line, i.module))
        .collect();
    let want = [
        (1, "keys"),
        (2, "store"),
        (2, "history"),
        (7, "send"),
        (8, "search"),
        (9, "relations"),
    ];
    let want: Vec<(usize, String)> = want.iter().map(|(l, m)| (*l, m.to_string())).collect();
    assert_eq!(found, want);
}

#[test]
fn a_file_one_level_deep_reaches_the_crate_root_with_one_super() {
    let found: Vec<String> = imports("use super::gateway::Gateway;\n", 1)
        .into_iter()
        .map(|i| i.module)
        .collect();
    assert_eq!(found, ["gateway"]);
    assert!(
        imports("use super::x;\n", 2).is_empty(),
        "a sibling, same module"
    );
}
