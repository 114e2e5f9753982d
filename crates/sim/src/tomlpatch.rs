//! Dotted field paths into TOML tables (`iommu.cmdq`, `device[0].disks`,
//! `machine.costs."iommu.cmdq.sync_latency"`) and patches of scenarios by them: what sweeps
//! and experiment files use to derive scenarios from a base one.

/// One step of a field path: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// Parses a dotted field path: keys separated by `.`, a key may be quoted (`"a.b"`, for
/// keys that contain dots such as profile cost paths) and followed by `[N]` indices.
pub fn parse_path(field: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut chars = field.chars().peekable();
    loop {
        // One key: quoted (anything up to the closing quote) or bare (up to `.` or `[`).
        let mut key = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some(c) => key.push(c),
                    None => return Err(format!("unclosed quote in `{field}`")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' || c == '[' {
                    break;
                }
                key.push(c);
                chars.next();
            }
        }
        if key.is_empty() {
            return Err(format!("empty key in `{field}`"));
        }
        steps.push(Step::Key(key));
        // Indices after the key.
        while chars.peek() == Some(&'[') {
            chars.next();
            let mut n = String::new();
            loop {
                match chars.next() {
                    Some(']') => break,
                    Some(c) => n.push(c),
                    None => return Err(format!("malformed index in `{field}`: expected `[N]`")),
                }
            }
            let n = n
                .parse::<usize>()
                .map_err(|_| format!("malformed index in `{field}`: expected `[N]`"))?;
            steps.push(Step::Index(n));
        }
        match chars.next() {
            None => return Ok(steps),
            Some('.') => {}
            Some(c) => {
                return Err(format!(
                    "unexpected `{c}` in `{field}`: expected `.` or `[N]` after a key"
                ))
            }
        }
    }
}

/// Writes a parsed path back as text.
pub fn render_steps(steps: &[Step]) -> String {
    let mut s = String::new();
    for st in steps {
        match st {
            Step::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                if k.contains(['.', '[', '"']) {
                    s.push('"');
                    s.push_str(k);
                    s.push('"');
                } else {
                    s.push_str(k);
                }
            }
            Step::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The value at `steps` in `table`, if present.
pub fn get_field<'t>(table: &'t toml::Table, steps: &[Step]) -> Option<&'t toml::Value> {
    let (Step::Key(first), rest) = steps.split_first()? else {
        return None;
    };
    let mut cur = table.get(first)?;
    for step in rest {
        cur = match (step, cur) {
            (Step::Key(k), toml::Value::Table(t)) => t.get(k)?,
            (Step::Index(i), toml::Value::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Sets the field at `steps` in `table` to `value`; the error says which prefix is missing.
/// With `create`, missing table keys are added (an optional field the base scenario leaves
/// out; the scenario's own validation then judges the field), array indices never are.
pub fn set_field(
    table: &mut toml::Table,
    steps: &[Step],
    value: toml::Value,
    create: bool,
) -> Result<(), String> {
    let Some((Step::Key(first), rest)) = steps.split_first() else {
        return Err("a field path starts with a key".to_owned());
    };
    // What a created key starts as: a table when a key follows it, else the value.
    let fresh = |next: Option<&Step>| match next {
        Some(Step::Key(_)) => Some(toml::Value::Table(toml::Table::new())),
        Some(Step::Index(_)) => None,
        None => Some(toml::Value::Boolean(false)),
    };
    if create && !table.contains_key(first) {
        if let Some(v) = fresh(rest.first()) {
            table.insert(first.clone(), v);
        }
    }
    let mut cur = table
        .get_mut(first)
        .ok_or_else(|| format!("the base scenario has no `{first}`"))?;
    for (i, step) in rest.iter().enumerate() {
        let here = render_steps(&steps[..i + 1]);
        cur = match (step, cur) {
            (Step::Key(k), toml::Value::Table(t)) => {
                if create && !t.contains_key(k) {
                    if let Some(v) = fresh(rest.get(i + 1)) {
                        t.insert(k.clone(), v);
                    }
                }
                t.get_mut(k).ok_or_else(|| {
                    format!(
                        "the base scenario has no `{}`",
                        render_steps(&steps[..i + 2])
                    )
                })?
            }
            (Step::Index(n), toml::Value::Array(a)) => {
                let len = a.len();
                a.get_mut(*n).ok_or_else(|| {
                    format!("`{here}` has {len} elements, so there is no index {n}")
                })?
            }
            (Step::Key(_), _) => return Err(format!("`{here}` is not a table")),
            (Step::Index(_), _) => return Err(format!("`{here}` is not an array")),
        };
    }
    // A `{ value = ..., source = ... }` field takes a plain value into its `value`.
    if let toml::Value::Table(t) = cur {
        if !value.is_table() && t.contains_key("value") {
            t.insert("value".to_owned(), value);
            return Ok(());
        }
    }
    *cur = value;
    Ok(())
}

/// Removes the field at the dotted path `field` from `table`; whether it was there.
pub fn remove_field(table: &mut toml::Table, field: &str) -> bool {
    let Ok(steps) = parse_path(field) else {
        return false;
    };
    let Some((Step::Key(last), parents)) = steps.split_last() else {
        return false;
    };
    let mut cur = table;
    for step in parents {
        let next = match step {
            Step::Key(k) => cur.get_mut(k),
            Step::Index(_) => return false,
        };
        match next {
            Some(toml::Value::Table(t)) => cur = t,
            _ => return false,
        }
    }
    cur.remove(last).is_some()
}

/// Merges `patch` into `table`: tables merge key by key, any other value (arrays included)
/// replaces what was there. A key `name[i]` merges into element `i` of the array of tables
/// `name`, which must exist. The error names the path that could not be patched.
pub fn merge(table: &mut toml::Table, patch: &toml::Table) -> Result<(), String> {
    merge_at(table, patch, "")
}

fn merge_at(table: &mut toml::Table, patch: &toml::Table, prefix: &str) -> Result<(), String> {
    for (key, value) in patch {
        let here = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let indexed = key
            .strip_suffix(']')
            .and_then(|k| k.split_once('['))
            .and_then(|(k, i)| i.parse::<usize>().ok().map(|i| (k, i)));
        if let Some((name, i)) = indexed {
            let Some(toml::Value::Array(items)) = table.get_mut(name) else {
                return Err(format!("`{here}`: there is no array `{name}` to index"));
            };
            let len = items.len();
            let Some(toml::Value::Table(item)) = items.get_mut(i) else {
                return Err(format!(
                    "`{here}`: `{name}` has {len} elements, so there is no table at index {i}"
                ));
            };
            let toml::Value::Table(p) = value else {
                return Err(format!(
                    "`{here}`: expected a table to merge into the element"
                ));
            };
            merge_at(item, p, &here)?;
            continue;
        }
        match (table.get_mut(key), value) {
            (Some(toml::Value::Table(t)), toml::Value::Table(p)) => merge_at(t, p, &here)?,
            _ => {
                table.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_keys_and_indices() {
        assert_eq!(
            parse_path("rows[2].fio.iodepth").unwrap(),
            vec![
                Step::Key("rows".into()),
                Step::Index(2),
                Step::Key("fio".into()),
                Step::Key("iodepth".into())
            ]
        );
        assert_eq!(render_steps(&parse_path("a[1][0].b").unwrap()), "a[1][0].b");
        assert!(parse_path("a..b").is_err());
        assert!(parse_path("a[x]").is_err());
        assert!(parse_path("a[1").is_err());
    }

    #[test]
    fn set_field_replaces_values_and_keeps_sources() {
        let mut t: toml::Table = toml::from_str(
            "[k]\nx = { value = 1, source = \"s\" }\n[[rows]]\nn = 1\n[[rows]]\nn = 2\n",
        )
        .unwrap();
        set_field(
            &mut t,
            &parse_path("k.x").unwrap(),
            toml::Value::Integer(7),
            false,
        )
        .unwrap();
        set_field(
            &mut t,
            &parse_path("rows[1].n").unwrap(),
            toml::Value::Integer(9),
            false,
        )
        .unwrap();
        assert_eq!(t["k"]["x"]["value"].as_integer(), Some(7));
        assert_eq!(t["k"]["x"]["source"].as_str(), Some("s"));
        assert_eq!(t["rows"][1]["n"].as_integer(), Some(9));
        assert_eq!(t["rows"][0]["n"].as_integer(), Some(1));
        let e = set_field(
            &mut t,
            &parse_path("rows[2].n").unwrap(),
            toml::Value::Integer(0),
            true,
        );
        assert!(e.unwrap_err().contains("2 elements"));
        let e = set_field(
            &mut t,
            &parse_path("k.y").unwrap(),
            toml::Value::Integer(0),
            false,
        );
        assert!(e.unwrap_err().contains("`k.y`"));
    }

    #[test]
    fn quoted_keys_keep_their_dots() {
        assert_eq!(
            parse_path("machine.costs.\"iommu.cmdq.sync_latency\"").unwrap(),
            vec![
                Step::Key("machine".into()),
                Step::Key("costs".into()),
                Step::Key("iommu.cmdq.sync_latency".into()),
            ]
        );
    }

    #[test]
    fn merge_is_deep_for_tables_and_replaces_the_rest() {
        let mut t: toml::Table =
            toml::from_str("[a]\nx = 1\ny = 2\n[[d]]\nk = 1\n[[d]]\nk = 2\n").unwrap();
        let p: toml::Table =
            toml::from_str("a = { y = 3, z = 4 }\n\"d[1]\" = { k = 5 }\n").unwrap();
        merge(&mut t, &p).unwrap();
        assert_eq!(t["a"]["x"].as_integer(), Some(1));
        assert_eq!(t["a"]["y"].as_integer(), Some(3));
        assert_eq!(t["a"]["z"].as_integer(), Some(4));
        assert_eq!(t["d"][0]["k"].as_integer(), Some(1));
        assert_eq!(t["d"][1]["k"].as_integer(), Some(5));
        let p: toml::Table = toml::from_str("d = [{ k = 9 }]\n").unwrap();
        merge(&mut t, &p).unwrap();
        assert_eq!(t["d"].as_array().map(Vec::len), Some(1));
        let p: toml::Table = toml::from_str("\"d[3]\" = { k = 9 }\n").unwrap();
        assert!(merge(&mut t, &p)
            .unwrap_err()
            .contains("no table at index 3"));
    }
}
