package obs

import "time"

// The health verdict (the console's green/amber/red per area) and the
// Prometheus alert rules grade by the same bounds: this table is their one
// definition. deploy/prometheus/alerts.yaml states each bound in its rule's
// expression; deploy's TestAlertThresholdsMatchTable fails when a rule's
// bound, severity or hold time differs from its row here, so a change is
// made in both or the build breaks.

// Severity of a bound: the alert rule's severity label.
const (
	// SeverityWarning is an alert that notifies: amber in the verdict.
	SeverityWarning = "warning"
	// SeverityCritical is an alert that pages: red in the verdict.
	SeverityCritical = "critical"
)

// Areas the verdict grades.
const (
	AreaIngestion  = "ingestion"
	AreaLag        = "consumer_lag"
	AreaDLQ        = "dlq"
	AreaRedis      = "redis"
	AreaDownstream = "downstream"
)

// Threshold is one alert rule's bound: the rule fires when the graded value
// is above Value (at or above for an equality rule: Equal) for For.
type Threshold struct {
	// Alert is the rule's name in deploy/prometheus/alerts.yaml.
	Alert    string
	Area     string
	Severity string
	// Value is the bound: the right-hand side of the rule's comparison.
	Value float64
	// Equal: the rule compares with == (a 0/1 gauge), not >.
	Equal bool
	// For is the rule's hold time (0: fires at once).
	For time.Duration
	// What says what is graded, for people.
	What string
}

// Exceeded reports whether v passes the bound (the rule's comparison
// holds).
func (t Threshold) Exceeded(v float64) bool {
	if t.Equal {
		return v == t.Value
	}
	return v > t.Value
}

// Thresholds are the bounds the verdict grades by, each an alert rule's.
// Redis has no numeric row: its rule (KfpipeRedisOutOfMemory) fires on any
// refused write, which the verdict sees as used memory at maxmemory.
var Thresholds = []Threshold{
	{Alert: "KfpipeWeChatHorizonWarning", Area: AreaIngestion, Severity: SeverityWarning, Value: 24 * 3600, For: 10 * time.Minute,
		What: "seconds the oldest message of an account may have waited in WeChat"},
	{Alert: "KfpipeWeChatHorizonCritical", Area: AreaIngestion, Severity: SeverityCritical, Value: 48 * 3600, For: 10 * time.Minute,
		What: "seconds the oldest message of an account may have waited in WeChat"},
	{Alert: "KfpipeConsumerLagHigh", Area: AreaLag, Severity: SeverityWarning, Value: 10000, For: 5 * time.Minute,
		What: "messages the schedule-consumers are behind the main topic (sum over partitions)"},
	{Alert: "KfpipeConsumerLagCritical", Area: AreaLag, Severity: SeverityCritical, Value: 100000, For: 15 * time.Minute,
		What: "messages the schedule-consumers are behind the main topic (sum over partitions)"},
	{Alert: "KfpipeDLQGrowthHigh", Area: AreaDLQ, Severity: SeverityWarning, Value: 100,
		What: "dead letters in the last hour"},
	{Alert: "KfpipeDLQManualReviewBacklog", Area: AreaDLQ, Severity: SeverityCritical, Value: 100, For: 15 * time.Minute,
		What: "dead letters waiting for manual review"},
	{Alert: "KfpipeDownstreamOutage", Area: AreaDownstream, Severity: SeverityCritical, Value: 1, Equal: true, For: 2 * time.Minute,
		What: "the downstream gate of a schedule-consumer is open (1)"},
}

// ThresholdsOf returns the rows of area, warning before critical.
func ThresholdsOf(area string) []Threshold {
	var out []Threshold
	for _, sev := range []string{SeverityWarning, SeverityCritical} {
		for _, t := range Thresholds {
			if t.Area == area && t.Severity == sev {
				out = append(out, t)
			}
		}
	}
	return out
}
