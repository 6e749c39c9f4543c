use super::*;

/// First example of §11.6: type 0x14, alias 2, group 0, subgroup 0, priority 0.
#[test]
fn spec_example_subgroup() {
    let h = SubgroupHeader {
        track_alias: 2,
        group: 0,
        subgroup: SubgroupId::Explicit(0),
        priority: Some(0),
        has_properties: false,
        end_of_group: false,
        first_object: false,
    };
    let mut b = Vec::new();
    h.encode(&mut b);
    assert_eq!(b, [0x14, 2, 0, 0, 0]);
}
