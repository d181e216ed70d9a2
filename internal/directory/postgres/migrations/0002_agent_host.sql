-- Who operates the client an agent runs in: 'headless' (the default: the agent runtime's code
-- answers what the server asks) or 'interactive' (its user does). Only an interactive host's
-- answer to a confirmation form counts as the user's decision.
ALTER TABLE agents ADD COLUMN host text NOT NULL DEFAULT 'headless' CHECK (host IN ('headless', 'interactive'));
