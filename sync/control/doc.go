// Package control is the wire format of the elastic layer's control
// messages — epoch announcements, failure reports, liveness pings, the end of
// training and step statistics — which ride on the membership layer's
// reliable messages between the proposer (usually the job's driver) and the
// workers. Decode checks everything it accepts: these bytes come from the
// network; no epoch number above epoch.MaxNumber passes it. Who sent a
// message is the membership layer's signed sender, never a field here.
package control
