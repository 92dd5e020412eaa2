use super::*;

fn load(in_flight: u32, room: u32, priority: u32) -> Load {
    Load {
        in_flight,
        learned: room,
        room,
        priority,
        weight: 1.0,
        ejections: 0,
        out_for: None,
        waiting: 0,
    }
}

#[test]
fn demand_goes_to_primaries_evenly_then_to_backups() {
    let loads = [load(0, 4, 0), load(0, 4, 0), load(0, 8, 1)];
    let free = [4, 4, 8];
    assert_eq!(spread(&loads, &free, 5), vec![3, 2, 0]);
    assert_eq!(spread(&loads, &free, 10), vec![4, 4, 2]);
    // Beyond every room: nothing more is asked.
    assert_eq!(spread(&loads, &free, 40), vec![4, 4, 8]);
}

#[test]
fn the_wire_is_covered_first_and_a_taken_primary_spills_to_the_backup_before_waiting() {
    // 3 on the first endpoint's wire: they keep their slots whatever the demand says.
    let loads = [load(3, 4, 0), load(0, 4, 1)];
    assert_eq!(spread(&loads, &[4, 4], 1), vec![3, 0]);
    // Others hold the primary: the backup's free slots first, then the primary (to wait).
    let loads = [load(0, 4, 0), load(0, 2, 1)];
    assert_eq!(spread(&loads, &[0, 2], 3), vec![1, 2]);
    assert_eq!(spread(&loads, &[0, 2], 1), vec![0, 1]);
}

#[test]
fn an_endpoint_out_or_paused_is_asked_for_nothing_beyond_its_wire() {
    let loads = [load(2, 0, 0), load(0, 4, 0)];
    assert_eq!(spread(&loads, &[4, 4], 6), vec![2, 4]);
    let weighted = [
        Load {
            weight: 3.0,
            ..load(0, 4, 0)
        },
        load(0, 4, 0),
    ];
    assert_eq!(spread(&weighted, &[4, 4], 4), vec![3, 1]);
}

#[test]
fn a_pick_waiting_for_a_lease_is_asked_for_where_it_waits() {
    // A failover from the first endpoint waits on the second: demand 1 goes there.
    let loads = [
        load(0, 4, 0),
        Load {
            waiting: 1,
            ..load(0, 4, 0)
        },
    ];
    assert_eq!(spread(&loads, &[4, 4], 1), vec![0, 1]);
}
