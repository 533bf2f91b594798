//! holdfast services wiring the domain rules to the ports, and the `holdfast` command.
