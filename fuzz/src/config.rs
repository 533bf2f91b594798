//! The app's TOML configuration loader, validation and the key table.

use holdfast::Config;
use holdfast::config::KEYS;

use crate::Input;

/// The whole input is the TOML text.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    check(&input.rest_text());
}

/// Parses `text`; a parsed config validates without panicking, and a valid one
/// converts into domain settings that are valid too, and survives a round trip
/// through every key's shown form (what `holdfast config` prints, without its
/// code quotes) set back as the environment would set it.
pub fn check(text: &str) {
    let config = match Config::from_toml_str(text) {
        Ok(config) => config,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    if let Err(e) = config.validate() {
        let message = e.to_string();
        assert!(message.contains("expected"), "no expectation in: {message}");
        return;
    }
    assert_eq!(config.selection_config().validate(), Ok(()));
    assert_eq!(config.lease_config().validate(), Ok(()));
    assert!(config.precision_bits().is_ok());
    let mut copy = Config::default();
    for key in KEYS {
        let shown = (key.get)(&config);
        if key.key == "seed" && config.seed.is_none() {
            continue; // shown as a sentence ("none (OS entropy)"); unset is the default
        }
        let shown = shown
            .strip_prefix('`')
            .and_then(|s| s.strip_suffix('`'))
            .unwrap_or(&shown);
        if let Err(expected) = (key.set)(&mut copy, shown) {
            panic!(
                "{} = {shown:?} is refused on the way back: expected {expected}",
                key.key
            );
        }
    }
    copy.admission.queues = config.admission.queues.clone();
    assert_eq!(copy, config, "the key table does not round-trip");
}
