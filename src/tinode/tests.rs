use super::*;

#[test]
fn parses_sdk_messages() {
    let m: ClientMsg = serde_json::from_str(
            r#"{"hi":{"id":"83575","ver":"0.25.3","ua":"gw-test/1.0 (undefined); tinodejs/0.25.3","lang":"xx","platf":"web"}}"#,
        )
        .unwrap();
    assert_eq!(m.hi.unwrap().ver.as_deref(), Some("0.25.3"));
    let m: ClientMsg = serde_json::from_str(
            r#"{"pub":{"id":"4","topic":"grpX","noecho":true,"head":{"mime":"text/x-drafty","client_mid":"c1"},"content":"hi"}}"#,
        )
        .unwrap();
    let p = m.publish.unwrap();
    assert!(p.noecho);
    assert_eq!(p.head.unwrap()["client_mid"], "c1");
    let m: ClientMsg = serde_json::from_str(
            r#"{"get":{"id":"5","topic":"grpX","what":"data","data":{"ranges":[{"low":1,"hi":3}],"limit":3}}}"#,
        )
        .unwrap();
    let g = m.get.unwrap();
    assert_eq!(g.query.what, "data");
    assert_eq!(g.query.data.unwrap().ranges.unwrap()[0].hi, Some(3));
}

#[test]
fn timestamps_have_milliseconds_and_z() {
    let t = timestamp_ms(1_790_000_000_123);
    assert_eq!(t.len(), 24);
    assert!(t.ends_with(".123Z"), "{t}");
}

#[test]
fn names() {
    assert!(is_group_topic("grpAbc_9-x"));
    assert!(!is_group_topic("grp"));
    assert!(!is_group_topic("usrAbc"));
    assert!(!is_group_topic("grp a"));
    assert_eq!(parse_user_id("usr1001"), Some(1001));
    assert_eq!(parse_user_id("usr0"), None);
    assert_eq!(parse_version("0.25.3"), Some((0, 25)));
    assert_eq!(parse_version("x"), None);
}

#[test]
fn p2p_names_are_one_per_pair() {
    let t = p2p_topic(7, 1001);
    assert_eq!(t, p2p_topic(1001, 7));
    assert_eq!(t.len(), 25);
    assert_eq!(parse_p2p_topic(&t), Some((7, 1001)));
    assert_eq!(p2p_peer(&t, 7), Some(1001));
    assert_eq!(p2p_peer(&t, 1001), Some(7));
    assert_eq!(p2p_peer(&t, 8), None);
    assert_eq!(resolve_topic("usr1001", 7).as_deref(), Some(t.as_str()));
    assert_eq!(resolve_topic("usr7", 7), None, "no p2p topic with oneself");
    assert_eq!(resolve_topic(&t, 8), None, "not a party");
    assert_eq!(client_topic(&t, 7), "usr1001");
    assert_eq!(client_topic("grpX", 7), "grpX");
    assert!(parse_p2p_topic("p2pAAAA").is_none());
    assert!(is_conversation_topic(&t) && is_conversation_topic("grpX"));
}
