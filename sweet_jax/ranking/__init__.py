"""Best-of-N: the actor's candidates sampled, ranked by a critic's advantage and paired (candidates), the judges that
score them (judges, and the frontend's vision-language critic: vision_critic), through servers or in process
(endpoints), best-of-N evaluation on test tasks (selection, scoring answers: evaluation), and judges measured against
the testbed's true values (testbed_judges, credit_diagnostics)."""
